"""Hub model names: ``owner/name[@revision]`` with an optional ``hf:`` / ``modelscope:`` prefix (``HubName``,
``parse_hub_name``), the hubs Cadenza downloads from, and the two helpers their clients share."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cadenza.errors import InputError, MissingDependencyError

HUGGINGFACE = "huggingface"
MODELSCOPE = "modelscope"
PREFIXES = {"hf:": HUGGINGFACE, "huggingface:": HUGGINGFACE, "modelscope:": MODELSCOPE, "ms:": MODELSCOPE}
EXTRAS = {HUGGINGFACE: ("huggingface_hub", "hub"), MODELSCOPE: ("modelscope", "modelscope")}
TITLES = {HUGGINGFACE: "Hugging Face", MODELSCOPE: "ModelScope"}
# Hugging Face's repo id rule (owner/name, 96 characters each, no "--" or ".."), shared by ModelScope's ids.
REPO_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# A branch, tag or commit (``refs/pr/1`` included); no "..", no leading "/" or "-".
REVISION_PATTERN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]{0,254}")
@dataclass(frozen=True)
class HubName:
    """A repository on a hub: ``hub`` is ``"huggingface"`` or ``"modelscope"``; ``revision`` None: the default
    branch. ``explicit``: written with a prefix (``hf:``, ``modelscope:``), so never a local path."""

    hub: str
    repo_id: str
    revision: str | None = None
    explicit: bool = False

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_name(value: str) -> HubName | None:
    """``owner/name[@revision]`` with an optional ``hf:`` / ``modelscope:`` prefix -> ``HubName``; None when
    ``value`` cannot be a repository name (an absolute or ``./`` path, more than one ``/``, ``~``, ...).
    A prefixed value that is not a valid name is an ``InputError`` naming the rule it breaks."""
    hub, rest, explicit = HUGGINGFACE, value, False
    for prefix, name in PREFIXES.items():
        if value.startswith(prefix):
            hub, rest, explicit = name, value[len(prefix):], True
            break
    repo_id, at, revision = rest.partition("@")
    valid = (REPO_ID_PATTERN.fullmatch(repo_id) is not None and "--" not in repo_id and ".." not in repo_id
             and (not at or (REVISION_PATTERN.fullmatch(revision) is not None and ".." not in revision)))
    if not valid:
        if explicit:
            raise InputError(f"{value[:200]!r} is not a {TITLES[hub]} model name: expected owner/name or "
                             "owner/name@revision (letters, digits, '-', '_', '.')")
        return None
    return HubName(hub, repo_id, revision or None, explicit)


def require_hub_package(hub: str):
    """The hub's client package (imported), or ``MissingDependencyError`` naming the extra to install."""
    module, extra = EXTRAS[hub]
    try:
        return __import__(module)
    except ImportError as exc:
        raise MissingDependencyError(f"downloading {TITLES[hub]} models needs the '{extra}' extra ({module} is "
                                     f"missing): pip install 'cadenza[{extra}]'; or pass a local model folder") \
            from exc


def failure_reason(exc: BaseException) -> str:
    """The first line of an exception's message, with its type."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
