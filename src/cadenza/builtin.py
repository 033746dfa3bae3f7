"""The model shipped inside the package (cadenza-tiny) and how a missing ``--model`` resolves to it.

cadenza-tiny is a small CosyVoice-2-architecture model trained by ``recipes/tiny`` (see docs/cadenza-tiny.md); its
folder has the same layout as a released CosyVoice 2 directory plus ``cadenza.json`` (name, default speaker, the
voice table). Any model folder may carry a ``cadenza.json``; ``default_speaker`` and ``speed_method`` (how the
model's ``speed`` is best made, when the caller names none) are what synthesis reads of it.

``cadenza.json`` is checked key by key when a model loads (``ModelMetadata``): a wrong type or an unknown ``status``
is a ``CheckpointError`` naming the file and the key, not a value that is silently ignored.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cadenza.engine.stream_schedule import SPEED_METHODS
from cadenza.errors import CheckpointError, InputError
from cadenza.loading.files import read_json_object
from cadenza.loading.hub import locate_model

log = logging.getLogger(__name__)

BUILTIN_NAME = "cadenza-tiny"
METADATA_NAME = "cadenza.json"
METADATA_FORMAT = "cadenza.model"
METADATA_VERSIONS = (1, 2)  # 2 added text_frontend; both are read the same way
STATUSES = ("experimental", "preview", "stable")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
_TEXT_KEYS = ("status_note", "text_frontend", "recipe")


def builtin_model_dir() -> Path:
    """The packaged cadenza-tiny folder (raises if this install lacks it, e.g. a source tree without the assets)."""
    path = Path(__file__).resolve().parent / "assets" / BUILTIN_NAME
    if not (path / "llm.pt").is_file():
        raise CheckpointError(f"the built-in model is missing from this install ({path}); reinstall cadenza or pass "
                              "a model directory")
    return path


def resolve_model_path(path: str | os.PathLike | None, revision: str | None = None) -> Path:
    """``None`` or ``"cadenza-tiny"`` -> the built-in model; an existing folder -> itself (``~`` expanded); a hub name
    (``owner/name[@revision]``, ``modelscope:owner/name``) -> its folder in the hub's cache, downloaded when needed;
    anything else -> that path. See ``cadenza.loading.hub.locate_model``.

    A real folder named ``cadenza-tiny`` (or ``owner/name``) in the working directory wins over the name."""
    if path is None or (str(path) == BUILTIN_NAME and not Path(path).is_dir()):
        if revision is not None:
            raise InputError("revision applies to hub model names, not to the built-in model")
        return builtin_model_dir()
    return locate_model(path, revision)


def local_model_path(path: str | os.PathLike) -> Path:
    """A path in a training config or a data command: ``"cadenza-tiny"`` names the built-in folder (unless a real
    ``cadenza-tiny`` exists here), anything else is the path itself, ``~`` expanded; never a hub download."""
    if str(path) == BUILTIN_NAME and not Path(path).exists():
        return builtin_model_dir()
    return Path(path).expanduser()


@dataclass(frozen=True)
class VoiceInfo:
    """One entry of ``voices``: a voice the model was trained on (``heldout``: kept out of training)."""

    name: str
    source: str = ""
    licence: str = ""
    heldout: bool = False
    train_minutes: float | None = None


@dataclass(frozen=True)
class ModelMetadata:
    """The typed content of ``cadenza.json`` (every key optional)."""

    format: str = METADATA_FORMAT
    version: int = METADATA_VERSIONS[-1]
    name: str | None = None
    default_speaker: str | None = None
    status: str | None = None  # one of STATUSES; "experimental" logs a warning at load
    status_note: str | None = None
    voices: tuple[VoiceInfo, ...] = ()
    speaker_prompts: dict[str, str] = field(default_factory=dict)
    text_frontend: str | None = None
    weights_dtype: str | None = None
    recipe: str | None = None
    speed_method: str | None = None  # how this model's speed != 1 is best made (StreamSchedule.speed_method)
    # Whether the LM continues a prompt (zero-shot: the transcript and speech tokens of the prompt audio before the
    # text). false: its LM learnt without prompts (cadenza-tiny), and a clone takes the voice from the audio only.
    lm_prompt: bool = True


def parse_model_metadata(doc: dict[str, Any], source: str = METADATA_NAME) -> ModelMetadata:
    """Check ``cadenza.json``'s keys by type and value; ``CheckpointError`` names ``source`` and the key.
    Unknown keys are logged and ignored (a newer writer may add some without changing the meaning of these)."""

    def fail(key: str, msg: str, value: Any) -> CheckpointError:
        shown = repr(value)
        return CheckpointError(f"{source}: {key} must be {msg}, got {shown if len(shown) <= 60 else shown[:57] + '...'}")

    def text(value: Any, key: str, optional: bool = True, blank: bool = True) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not (blank or value.strip()):
            raise fail(key, "a string" if blank else "a non-empty string", value)
        return value

    fmt = doc.get("format", METADATA_FORMAT)
    if fmt != METADATA_FORMAT:
        raise fail("format", repr(METADATA_FORMAT), fmt)
    version = doc.get("version", METADATA_VERSIONS[-1])
    if not isinstance(version, int) or isinstance(version, bool) or version not in METADATA_VERSIONS:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > METADATA_VERSIONS[-1]
        raise fail("version", f"one of {METADATA_VERSIONS}" + (" (written by a newer cadenza?)" if newer else ""),
                   version)
    status = doc.get("status")
    if status is not None and status not in STATUSES:
        raise fail("status", f"one of {STATUSES}", status)
    dtype = doc.get("weights_dtype")
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise fail("weights_dtype", f"one of {WEIGHT_DTYPES}", dtype)
    speed_method = doc.get("speed_method")
    if speed_method is not None and speed_method not in SPEED_METHODS:
        raise fail("speed_method", f"one of {SPEED_METHODS}", speed_method)
    lm_prompt = doc.get("lm_prompt", True)
    if not isinstance(lm_prompt, bool):
        raise fail("lm_prompt", "true or false", lm_prompt)
    voices_raw = doc.get("voices", [])
    if not isinstance(voices_raw, list):
        raise fail("voices", "a list of objects", voices_raw)
    voices = []
    for i, v in enumerate(voices_raw):
        key = f"voices[{i}]"
        if not isinstance(v, dict):
            raise fail(key, "an object", v)
        minutes = v.get("train_minutes")
        if minutes is not None and (not isinstance(minutes, (int, float)) or isinstance(minutes, bool)
                                    or not math.isfinite(minutes) or minutes < 0):
            raise fail(f"{key}.train_minutes", "a non-negative number", minutes)
        heldout = v.get("heldout", False)
        if not isinstance(heldout, bool):
            raise fail(f"{key}.heldout", "true or false", heldout)
        voices.append(VoiceInfo(name=text(v.get("name"), f"{key}.name", optional=False, blank=False),
                                source=text(v.get("source"), f"{key}.source") or "",
                                licence=text(v.get("licence"), f"{key}.licence") or "",
                                heldout=heldout, train_minutes=None if minutes is None else float(minutes)))
    prompts = doc.get("speaker_prompts", {})
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(t, str) for k, t in prompts.items()):
        raise fail("speaker_prompts", "an object of speaker -> transcript strings", prompts)
    unknown = sorted(set(doc) - set(ModelMetadata.__dataclass_fields__))
    if unknown:
        log.warning("%s: ignoring unknown keys %s", source, unknown)
    return ModelMetadata(
        format=fmt, version=version, status=status, weights_dtype=dtype, voices=tuple(voices), speaker_prompts=prompts,
        speed_method=speed_method, lm_prompt=lm_prompt,
        name=text(doc.get("name"), "name", blank=False),
        default_speaker=text(doc.get("default_speaker"), "default_speaker", blank=False),
        **{k: text(doc.get(k), k) for k in _TEXT_KEYS},
    )


def read_model_metadata(directory: Path) -> dict:
    """``cadenza.json`` of a model folder, or ``{}`` when absent; checked with ``parse_model_metadata`` (raises
    ``CheckpointError`` naming the file and the key), returned as the parsed JSON object."""
    path = Path(directory) / METADATA_NAME
    if not (path.exists() or path.is_symlink()):
        return {}
    doc = read_json_object(path, METADATA_NAME)
    parse_model_metadata(doc, str(path))
    return doc
