"""The model families Cadenza can load (``FAMILIES``, ``register_family``): each says, by dotted names imported only
when used, how to recognise its folder from the file names, which files a folder must hold, and how to load one.
``cadenza.load`` (``api/loading.py``) picks a folder's family from here, and ``loading/hub.py`` recognises a hub
repository's family from its file list."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import InputError
from cadenza.loading.release_files import ReleaseFiles


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
           frozenset({"dtype", "voices_dir", "scheduler", "watermark", "speed_method",
                      "stream_schedule"}),
           "cadenza.models.cosyvoice2.loader:RELEASE_FILES", chooses_precision=True, int8=True),
    Family("voxcpm2", "VoxCPM 2", "cadenza.models.voxcpm2.loader:is_voxcpm2_dir",
           "cadenza.api.voxcpm2:VoxCPM2.from_pretrained",
           frozenset({"dtype", "lora", "scheduler", "voices_dir", "watermark", "speed_method"}),
           "cadenza.models.voxcpm2.loader:RELEASE_FILES"),
]


def register_family(family: Family) -> None:
    """Let ``load`` recognise another family of model folders (checked after the built-in ones)."""
    if any(f.name == family.name for f in FAMILIES):
        raise InputError(f"a model family named {family.name!r} is already registered")
    FAMILIES.append(family)
