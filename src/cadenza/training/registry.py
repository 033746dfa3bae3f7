"""Find a training stage by name, importing only the module that defines it.

Every stage is registered here by name with the module that defines it (``STAGE_MODULES``); the module's
``@register`` (``cadenza.training.stage``) adds the class when it is imported. Nothing is recognised by a file-name
prefix: a stage exists because it is listed, and the launcher imports only its module, so a GPU-less user training
the LM never imports the vocoder's discriminators. Stages outside this package are added with
``register_stage_module(name, "package.module")``.
"""

from __future__ import annotations

import importlib
import re

from cadenza.errors import InputError
from cadenza.training.stage import STAGES, TrainingStage

# stage name -> the module whose import registers it.
STAGE_MODULES: dict[str, str] = {
    "lm": "cadenza.training.lm_stage",
    "dpo": "cadenza.training.dpo_stage",
    "flow": "cadenza.training.flow_stage",
    "tokenizer": "cadenza.training.speech_tokenizer_stage",
    "frame_tokenizer": "cadenza.training.frame_tokenizer_stage",
    "speaker": "cadenza.training.speaker_encoder_stage",
    "hift": "cadenza.training.hift_stage",
    "voxcpm2": "cadenza.training.voxcpm2.stage",
    "asr_reward": "cadenza.training.asr_reward_stage",
    "token_reader": "cadenza.training.token_reader_stage",
}
STAGE_NAMES = tuple(STAGE_MODULES)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):  # never a path, an empty name or 10 kB of text
        raise InputError(f"training stage name {str(name)[:80]!r} is not a stage name; known: "
                         f"{', '.join(STAGE_MODULES)}")
    return name


def register_stage_module(name: str, module: str) -> None:
    """Make stage ``name`` available from ``module`` (imported when the stage is first asked for)."""
    _check_name(name)
    if not isinstance(module, str) or not _MODULE.match(module):
        raise InputError(f"stage module {str(module)[:80]!r} is not a dotted module name")
    STAGE_MODULES[name] = module


def get_stage(name: str) -> type[TrainingStage]:
    """The registered stage class called ``name``; raises ``InputError`` naming what was tried."""
    _check_name(name)
    if name in STAGES:
        return STAGES[name]
    module = STAGE_MODULES.get(name)
    if module is None:
        raise InputError(f"training stage {name!r} is not available: known stages are {', '.join(STAGE_MODULES)}")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"training stage {name!r} is not available: importing {module} failed ({exc})") from exc
    if name not in STAGES:
        raise InputError(f"training stage {name!r} is not available: {module} registers no stage of that name")
    return STAGES[name]
