"""``load(path)``: any supported model folder -> its API object (``Cadenza`` or ``VoxCPM2``), by the files in it.

Families are registered (``FAMILIES``, ``register_family``), not recognised by name: each says how to recognise its
folder and how to load it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from cadenza.api.arguments import check_device
from cadenza.builtin import resolve_model_path
from cadenza.errors import CheckpointError, InputError
from cadenza.loading.release_files import ReleaseFiles
from cadenza.models.cosyvoice2.loader import inspect_directory


@dataclass(frozen=True)
class Family:
    """A model family ``load`` knows: how to recognise its folder (cheap: file names only) and how to load one.

    ``recognise``/``load`` are dotted ``module:function`` names, imported only when used (loading CosyVoice 2 never
    imports VoxCPM 2's code). ``accepts`` names the keyword arguments of ``load`` it takes beyond ``device``.
    ``files``: the dotted name of its ``ReleaseFiles`` (what a folder must hold and what is read), which lets a hub
    repository be recognised from its file list and downloaded without the files the family never reads.
    ``chooses_precision``: its ``dtype`` takes ``"auto"`` / a ``cadenza.engine.precision.Precision`` (per-component
    choice by CPU capability); otherwise ``"auto"`` means the family's own device-based default and is not passed.
    ``int8``: it can run its LM's and its flow's linear layers in int8 (``--lm-int8``, ``--flow-int8``).
    """

    name: str
    title: str
    recognise: str
    load: str
    accepts: frozenset[str] = frozenset()
    files: str | None = None
    chooses_precision: bool = False
    int8: bool = False

    def _function(self, spec: str):
        module, _, attr = spec.partition(":")
        target = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target

    def release_files(self) -> ReleaseFiles | None:
        return None if self.files is None else self._function(self.files)

    def owns(self, directory: Path) -> bool:
        return bool(self._function(self.recognise)(directory))

    def open(self, directory: Path, **kwargs):
        return self._function(self.load)(directory, **kwargs)


# Checked in this order; register_family adds more.
FAMILIES: list[Family] = [
    Family("cosyvoice2", "CosyVoice 2", "cadenza.models.cosyvoice2.loader:is_cosyvoice2_dir",
           "cadenza.api.cosyvoice2:Cadenza.from_pretrained",
           frozenset({"dtype", "voices_dir", "scheduler", "watermark", "speed_method"}),
           "cadenza.models.cosyvoice2.loader:RELEASE_FILES", chooses_precision=True, int8=True),
    Family("voxcpm2", "VoxCPM 2", "cadenza.models.voxcpm2.loader:is_voxcpm2_dir",
           "cadenza.api.voxcpm2:VoxCPM2.from_pretrained", frozenset({"dtype", "lora", "scheduler", "voices_dir", "watermark"}),
           "cadenza.models.voxcpm2.loader:RELEASE_FILES"),
]


def register_family(family: Family) -> None:
    """Let ``load`` recognise another family of model folders (checked after the built-in ones)."""
    if any(f.name == family.name for f in FAMILIES):
        raise InputError(f"a model family named {family.name!r} is already registered")
    FAMILIES.append(family)


def _family_of(directory: Path) -> Family:
    try:
        if not directory.is_dir():
            raise CheckpointError(f"model directory not found: {str(directory)[:200]}")
        for family in FAMILIES:
            if family.owns(directory):
                return family
    except OSError as exc:  # a path the OS refuses outright (name too long, no permission)
        raise CheckpointError(f"cannot open model directory {str(directory)[:200]!r}: {exc.strerror or exc}") from exc
    inspect_directory(directory)  # raises, listing what a CosyVoice 2 directory (the default family) lacks
    raise CheckpointError(f"{directory} is not a model directory of any known family "
                          f"({', '.join(f.title for f in FAMILIES)})")


def family_of(path: str | os.PathLike) -> Family:
    """The ``Family`` of a model folder, from the files in it."""
    return _family_of(Path(path).expanduser())


def model_family(path: str | os.PathLike) -> str:
    """The family name of a model folder (``"cosyvoice2"``, ``"voxcpm2"``, ...), from the files in it."""
    return family_of(path).name


def load(path: str | os.PathLike | None = None, revision: str | None = None, **kwargs):
    """Load any supported model: a ``Cadenza`` (CosyVoice 2) or a ``VoxCPM2``. ``path``: a model directory, a hub
    name (``"FunAudioLLM/CosyVoice2-0.5B"``, ``"owner/name@rev"``, ``"modelscope:owner/name"``; downloaded into the
    hub's cache, a local folder of that name wins; docs/models.md) or ``None`` for the built-in cadenza-tiny.
    ``revision``: the branch, tag or commit of a hub name. An argument the family does not take is an ``InputError``
    naming it."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InputError(f"the model path must be a string or a path, not {type(path).__name__}")
    if "device" in kwargs:
        check_device(kwargs["device"])
    # An argument no family takes fails before a hub name is downloaded (the family is known only after that).
    known = frozenset({"device"}).union(*(f.accepts for f in FAMILIES))
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise InputError(f"no model family takes {', '.join(unknown)} (load takes: {', '.join(sorted(known))})")
    directory = resolve_model_path(path, revision)
    family = _family_of(directory)
    unknown = sorted(set(kwargs) - family.accepts - {"device"})
    if unknown:
        raise InputError(f"{family.title} models do not take {', '.join(unknown)} (they take: device, "
                         f"{', '.join(sorted(family.accepts))})")
    return family.open(directory, **{k: v for k, v in kwargs.items() if k == "device" or k in family.accepts})
