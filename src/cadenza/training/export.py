"""Assemble a servable model directory from stage outputs: ``assemble_model_dir(lm_out, flow_out, hift_out, out=DIR)``.

Each stage exports its component (``llm.pt``, ``flow.pt``, ``hift.pt``) next to a ``cosyvoice2.yaml`` describing the
model it was built with. Assembling copies, for every component, the file of the *last* source that has it
(``base`` — e.g. the released CosyVoice2-0.5B folder — comes first, so trained parts replace released ones), takes
each component's yaml section from the same source, the Qwen2 config and tokenizer files from the LM's source, and
the frontend files (``campplus.onnx``, ``speech_tokenizer_v2.onnx``, ``spk2info.pt``) from the last source that has
them. A trained speech tokenizer / speaker encoder (the ``tokenizer`` / ``speaker`` stages' outputs:
``speech_tokenizer.{safetensors,json}``, ``speaker_encoder.{safetensors,json}``) is copied as a pair from the last
source that has both; the frontend prefers them to the ONNX files. The merged config must be consistent (the flow's
vocabulary = the LM's speech tokens = the trained tokenizer's codebook; the flow's ``spk_embed_dim`` = the trained
speaker encoder's embedding); ``verify`` then loads the directory the way ``Cadenza.from_pretrained`` does, with
strict key checks, and the trained frontend models with theirs.

``base`` may be ``"cadenza-tiny"`` (the built-in folder): its ``cadenza.json`` comes along (default voice, phoneme
frontend, ``lm_prompt``), renamed to ``out``'s folder name, so a flow / vocoder fine-tuned on your recordings
becomes a folder that speaks as the built-in one does (docs/training.md, "Your voice on the built-in model").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cadenza.builtin import METADATA_NAME, local_model_path, read_model_metadata
from cadenza.errors import CheckpointError, InputError
from cadenza.models.cosyvoice2.config import CosyVoice2Config, Qwen2Config
from cadenza.models.cosyvoice2.loader import CONFIG_NAMES, QWEN_DIR
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml
from cadenza.models.speaker_encoder import inference as speaker_io
from cadenza.models.speaker_encoder.config import SpeakerEncoderConfig
from cadenza.models.speech_tokenizer import inference as tokenizer_io
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.text.phonemes import PHONEMES_FILE
from cadenza.training.model_files import write_model_config

COMPONENTS = {"llm.pt": ("llm",), "flow.pt": ("flow", "token_mel_ratio", "chunk_size", "num_decoding_left_chunks",
                                               "spk_embed_dim"),
              "hift.pt": ("hift", "sample_rate", "feat_extractor")}
FRONTEND_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx", "spk2info.pt")
# Trained replacements of the two ONNX models: (weights, json) pairs, each copied whole from one source.
NATIVE_FRONTEND = {"speech tokenizer": (tokenizer_io.WEIGHTS_NAME, tokenizer_io.CONFIG_NAME),
                   "speaker encoder": (speaker_io.WEIGHTS_NAME, speaker_io.CONFIG_NAME)}


def _yaml_of(d: Path) -> dict[str, Any] | None:
    path = next((d / n for n in CONFIG_NAMES if (d / n).is_file()), None)
    return read_hyperpyyaml(path) if path is not None else None


def _last_with(sources: list[Path], rel: str) -> Path | None:
    found = [d for d in sources if (d / rel).is_file()]
    return found[-1] if found else None


def _last_with_all(sources: list[Path], names: tuple[str, ...]) -> Path | None:
    found = [d for d in sources if all((d / n).is_file() for n in names)]
    return found[-1] if found else None


def _check_native_frontend(chosen: dict[str, Path | None], cfg: CosyVoice2Config) -> None:
    """The trained tokenizer must emit the LM's speech vocabulary and the speaker encoder the flow's x-vector size
    (an LM / flow trained on other ids or embeddings would silently get nonsense, or index out of range)."""
    try:
        if chosen["speech tokenizer"] is not None:
            doc = tokenizer_io.read_speech_tokenizer_json(chosen["speech tokenizer"] / tokenizer_io.CONFIG_NAME)
            size = SpeechTokenizerConfig.from_dict(doc["config"]).codebook_size
            if size != cfg.lm.speech_token_size:
                raise InputError(f"the components do not fit together: the speech tokenizer of "
                                 f"{chosen['speech tokenizer']} has {size} ids but the LM / flow speech vocabulary "
                                 f"is {cfg.lm.speech_token_size}")
        if chosen["speaker encoder"] is not None:
            doc = speaker_io.read_speaker_encoder_json(chosen["speaker encoder"] / speaker_io.CONFIG_NAME)
            dim = SpeakerEncoderConfig.from_dict(doc["config"]).embedding_size
            if dim != cfg.flow.spk_embed_dim:
                raise InputError(f"the components do not fit together: the speaker encoder of "
                                 f"{chosen['speaker encoder']} makes {dim}-d embeddings but the flow's "
                                 f"spk_embed_dim is {cfg.flow.spk_embed_dim}")
    except CheckpointError as exc:
        raise InputError(f"unreadable trained frontend model: {exc}") from exc


def _check_contributes(run: Path) -> None:
    """An ``InputError`` for a stage folder with nothing to give (a run stopped before its export, its checkpoints
    folder, an empty folder): assembled anyway, the model would speak with the base's weights in its place."""
    files = (*COMPONENTS, *FRONTEND_FILES, *(n for names in NATIVE_FRONTEND.values() for n in names))
    if any((run / n).is_file() for n in files):
        return
    if run.name == "checkpoints" or any(run.glob("step_*.pt")):
        why = "is a run's checkpoints folder: give the run folder, once its training has exported"
    elif (run / "checkpoints").is_dir():
        why = ("holds checkpoints but no exported component: the run stopped before its export; finish it with "
               "`cadenza train STAGE --resume --out RUN` (with the same --config and --data)")
    else:
        why = f"holds no component ({', '.join(files)})"
    raise InputError(f"{run} {why}")


def _carry_metadata(base: Path, out: Path, trained: list[Path]) -> None:
    """``base``'s ``cadenza.json`` into ``out``, named after ``out`` and saying what was fine-tuned from it (its
    ``weights_dtype`` is dropped: stage exports are float32)."""
    doc = read_model_metadata(base)
    if not doc:
        return
    parts = sorted(n.removesuffix(".pt") for d in trained for n in COMPONENTS if (d / n).is_file())
    origin = doc.get("name") or base.name
    doc = {k: v for k, v in doc.items() if k != "weights_dtype"}
    doc["name"] = out.resolve().name
    doc["recipe"] = f"{origin} with its {', '.join(parts) or 'nothing'} fine-tuned (assemble_model_dir, base={origin})"
    if "status_note" in doc:  # the base's measured figures are not this folder's
        doc["status_note"] = f"{origin} with its {', '.join(parts) or 'nothing'} fine-tuned; not measured as a whole"
    (out / METADATA_NAME).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def assemble_model_dir(*stage_dirs: str | Path, out: str | Path, base: str | Path | None = None,
                       verify: bool = True) -> Path:
    """Copy the components of ``stage_dirs`` (later ones win) over ``base`` into ``out``; returns ``out``."""
    sources = ([local_model_path(base)] if base is not None else []) + [Path(d) for d in stage_dirs]
    for d in sources:
        if not d.is_dir():
            raise InputError(f"not a folder: {d}")
    out = Path(out)
    if any(out.resolve() == d.resolve() for d in sources):
        raise InputError("the assembled folder must differ from its sources")
    for d in sources[1 if base is not None else 0:]:
        _check_contributes(d)
    chosen = {name: _last_with(sources, name) for name in COMPONENTS}
    missing = [n for n, d in chosen.items() if d is None]
    if missing:
        raise InputError(f"no source has {', '.join(missing)} (give the stage outputs, or base=a released model folder)")
    yamls = {d: _yaml_of(d) for d in sources}
    merged: dict[str, Any] = {}
    for d in sources:  # start from the first yaml found, then component sections from their own sources
        if yamls[d] is not None:
            merged = dict(yamls[d])
            break
    for name, keys in COMPONENTS.items():
        y = yamls[chosen[name]]
        if y is not None:
            merged.update({k: y[k] for k in keys if k in y})
    if not merged:
        raise InputError("no source has a cosyvoice2.yaml / config.yaml")
    qwen_src = chosen["llm.pt"] if (chosen["llm.pt"] / QWEN_DIR / "config.json").is_file() else \
        _last_with(sources, f"{QWEN_DIR}/config.json")
    if qwen_src is None:
        raise InputError(f"no source has {QWEN_DIR}/config.json")
    try:
        cfg = CosyVoice2Config.from_dict(merged, Qwen2Config.from_json(qwen_src / QWEN_DIR / "config.json"), "merged config")
    except CheckpointError as exc:
        raise InputError(f"the components do not fit together: {exc}") from exc
    native = {what: _last_with_all(sources, names) for what, names in NATIVE_FRONTEND.items()}
    _check_native_frontend(native, cfg)
    # The text tokenizer: BPE files, or a phoneme table (cadenza-tiny), from the LM's source first.
    tok_src = next((d for d in (chosen["llm.pt"], *reversed(sources))
                    if any((d / QWEN_DIR / n).is_file() for n in ("vocab.json", PHONEMES_FILE))), None)
    out.mkdir(parents=True, exist_ok=True)
    write_model_config(out, cfg, tok_src / QWEN_DIR if tok_src is not None else None)
    for name, d in chosen.items():
        shutil.copyfile(d / name, out / name)
    for name in FRONTEND_FILES:
        d = _last_with(sources, name)
        if d is not None:
            shutil.copyfile(d / name, out / name)
    for what, names in NATIVE_FRONTEND.items():
        if native[what] is not None:
            for name in names:
                shutil.copyfile(native[what] / name, out / name)
    if base is not None:
        _carry_metadata(sources[0], out, [d for d in sources[1:] if any((d / n).is_file() for n in COMPONENTS)])
    if verify:
        from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights

        load_cosyvoice2_weights(inspect_directory(out))
        if native["speech tokenizer"] is not None:
            tokenizer_io.load_speech_tokenizer(out)
        if native["speaker encoder"] is not None:
            speaker_io.load_speaker_encoder(out)
    return out

