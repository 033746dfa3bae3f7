"""Find a training stage by name, importing only the module that defines it.

Stages register themselves with ``@register`` (``cadenza.training.stage``) when their module is imported. The
launcher imports lazily: a GPU-less user training the LM never imports the vocoder's discriminators. Each stage name
maps to module-name prefixes inside ``cadenza.training``; every module or package there whose name starts with one
of them is imported (packages: also their submodules) until the name is registered.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re

import cadenza.training as training_pkg
from cadenza.errors import InputError
from cadenza.training.stage import STAGES, TrainingStage

log = logging.getLogger(__name__)

# stage name -> module name prefixes under cadenza.training (first match wins).
STAGE_MODULE_PREFIXES: dict[str, tuple[str, ...]] = {
    "lm": ("lm_stage",),
    "dpo": ("dpo_stage",),
    "flow": ("flow_stage",),
    "tokenizer": ("speech_tokenizer",),
    "frame_tokenizer": ("frame_tokenizer",),
    "speaker": ("speaker_encoder",),
    "hift": ("hift",),
}
STAGE_NAMES = tuple(STAGE_MODULE_PREFIXES)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _candidates(prefixes: tuple[str, ...]) -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(training_pkg.__path__)]
    # Exact "<prefix>_stage" modules first, then the rest in name order.
    return sorted((n for n in names if n.startswith(prefixes)), key=lambda n: (not n.endswith("_stage"), n))


def _import(name: str, errors: list[str]) -> None:
    full = f"{training_pkg.__name__}.{name}"
    try:
        module = importlib.import_module(full)
    except ImportError as exc:
        errors.append(f"{full}: {exc}")
        return
    path = getattr(module, "__path__", None)
    if path is not None:  # a package: its stage may live in a submodule
        for sub in pkgutil.iter_modules(path):
            try:
                importlib.import_module(f"{full}.{sub.name}")
            except ImportError as exc:
                errors.append(f"{full}.{sub.name}: {exc}")


def get_stage(name: str) -> type[TrainingStage]:
    """The registered stage class called ``name``; raises ``InputError`` naming what was tried."""
    if not isinstance(name, str) or not _NAME.match(name):  # never a path, an empty prefix or 10 kB of text
        raise InputError(f"training stage name {str(name)[:80]!r} is not a stage name; known: {', '.join(STAGE_NAMES)}")
    if name in STAGES:
        return STAGES[name]
    prefixes = STAGE_MODULE_PREFIXES.get(name, (name,))
    tried: list[str] = []
    errors: list[str] = []
    for module in _candidates(prefixes):
        tried.append(module)
        _import(module, errors)
        if name in STAGES:
            return STAGES[name]
    detail = f"; import errors: {'; '.join(errors)}" if errors else ""
    where = ", ".join(tried) if tried else f"no module named {'/'.join(p + '*' for p in prefixes)} in cadenza.training"
    raise InputError(f"training stage {name!r} is not available (looked in: {where}){detail}")
