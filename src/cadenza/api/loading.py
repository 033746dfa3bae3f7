"""``load(path)``: any supported model folder -> its API object (``Cadenza`` or ``VoxCPM2``), by the files in it.

Families are registered (``FAMILIES``, ``register_family``: ``loading/families.py``, re-exported here), not
recognised by name: each says how to recognise its folder and how to load it.
"""

from __future__ import annotations

import os
from pathlib import Path

from cadenza.api.arguments import check_device
from cadenza.builtin import resolve_model_path
from cadenza.errors import CheckpointError, InputError
from cadenza.loading.families import FAMILIES, Family, register_family
from cadenza.models.cosyvoice2.loader import inspect_directory


def _family_of(directory: Path) -> Family:
    try:
        if not directory.is_dir():
            raise CheckpointError(f"model directory not found: {str(directory)[:200]}")
        for family in FAMILIES:
            if family.owns(directory):
                return family
    except OSError as exc:  # a path the OS refuses outright (name too long, no permission)
        raise CheckpointError(f"cannot open model directory {str(directory)[:200]!r}: {exc.strerror or exc}") from exc
    from cadenza.models.voxcpm2.loader import config_problem

    problem = config_problem(directory)  # a VoxCPM 2 folder with a bad config.json: say that, not CosyVoice 2's files
    if problem is not None:
        raise CheckpointError(problem)
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


__all__ = ["FAMILIES", "Family", "family_of", "load", "model_family", "register_family"]
