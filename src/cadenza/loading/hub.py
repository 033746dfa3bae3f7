"""Model names -> model folders: a local folder, the built-in model, or a hub repository downloaded into its cache.

Every entry point (``cadenza.load``, ``Cadenza.from_pretrained``, ``VoxCPM2.from_pretrained``, the CLI's ``--model``,
``cadenza serve --model [NAME=]...``) resolves its model through ``locate_model``:

* ``None`` or ``"cadenza-tiny"``: the built-in model;
* a path that exists: that folder, always (a local ``FunAudioLLM/CosyVoice2-0.5B`` folder wins over the hub);
* ``owner/name``, ``owner/name@revision`` or ``hf:owner/name``: a Hugging Face repository, through
  ``huggingface_hub`` (the ``hub`` extra) into its standard cache, honouring ``HF_HOME`` / ``HF_HUB_CACHE``,
  ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_TOKEN`` and its progress bars;
* ``modelscope:owner/name[@revision]``: a ModelScope repository, through ``modelscope`` (the ``modelscope`` extra);
* anything else: that path (the loader reports what is missing).

The repository's file list is read first: its family is recognised from the file names (``Family.files``), a
repository lacking a file the family cannot load without is refused naming it, and only the files the family reads
are downloaded (not, e.g., the 1 GB ``CosyVoice-BlankEN/model.safetensors`` CosyVoice 2 releases carry). Offline, the
file list comes from the cache. See docs/models.md.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import CheckpointError, InputError, MissingDependencyError
from cadenza.loading.release_files import folder_files

log = logging.getLogger(__name__)

HUGGINGFACE = "huggingface"
MODELSCOPE = "modelscope"
PREFIXES = {"hf:": HUGGINGFACE, "huggingface:": HUGGINGFACE, "modelscope:": MODELSCOPE, "ms:": MODELSCOPE}
EXTRAS = {HUGGINGFACE: ("huggingface_hub", "hub"), MODELSCOPE: ("modelscope", "modelscope")}
TITLES = {HUGGINGFACE: "Hugging Face", MODELSCOPE: "ModelScope"}
# Hugging Face's repo id rule (owner/name, 96 characters each, no "--" or ".."), shared by ModelScope's ids.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# A branch, tag or commit (``refs/pr/1`` included); no "..", no leading "/" or "-".
_REVISION = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]{0,254}")
# <cache>/models--owner--name/snapshots/<commit>: the layout of huggingface_hub's cache.
_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)")


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
    valid = (_REPO_ID.fullmatch(repo_id) is not None and "--" not in repo_id and ".." not in repo_id
             and (not at or (_REVISION.fullmatch(revision) is not None and ".." not in revision)))
    if not valid:
        if explicit:
            raise InputError(f"{value[:200]!r} is not a {TITLES[hub]} model name: expected owner/name or "
                             "owner/name@revision (letters, digits, '-', '_', '.')")
        return None
    return HubName(hub, repo_id, revision or None, explicit)


def locate_model(path: str | os.PathLike | None, revision: str | None = None) -> Path:
    """The folder of the model ``path`` names (see the module's docstring); downloads a hub repository that is not
    yet complete in the cache. ``revision``: the branch, tag or commit of a hub name (``name@rev`` says the same)."""
    from cadenza.builtin import BUILTIN_NAME, builtin_model_dir

    if revision is not None and (not isinstance(revision, str) or _REVISION.fullmatch(revision) is None
                                 or ".." in revision):
        raise InputError(f"revision must be a branch, tag or commit name, got {str(revision)[:80]!r}")
    if path is None or (str(path) == BUILTIN_NAME and not Path(path).is_dir()):
        if revision is not None:
            raise InputError("revision applies to hub model names, not to the built-in model")
        return builtin_model_dir()
    text = os.fspath(path)
    local = Path(text).expanduser()
    name = parse_hub_name(text) if isinstance(text, str) else None
    try:
        exists = local.exists() or local.is_symlink()
    except (OSError, ValueError):  # a name the OS refuses (too long, NUL): the loader reports it
        exists = False
    if exists and not (name and name.explicit):
        if revision is not None:
            raise InputError(f"revision applies to hub model names; {text[:200]!r} is a local folder")
        return local
    if name is None:
        if revision is not None:
            raise InputError(f"revision applies to hub model names (owner/name); {text[:200]!r} is not one")
        return local  # missing: the loader names it
    if revision is not None:
        if name.revision is not None and name.revision != revision:
            raise InputError(f"{text!r} names revision {name.revision!r} but revision={revision!r} was given")
        name = HubName(name.hub, name.repo_id, revision, name.explicit)
    return download_model(name)


def download_model(name: HubName) -> Path:
    """The local folder of the repository ``name``: its family's files, downloaded (resuming a transfer that
    stopped) into the hub's cache, or found there. ``CheckpointError`` names a repository, revision or file that
    does not exist; ``MissingDependencyError`` names the extra to install."""
    from cadenza.api.loading import FAMILIES

    if name.hub == MODELSCOPE:
        from cadenza.loading.modelscope_hub import ModelScopeHub

        hub = ModelScopeHub()
    else:
        hub = HuggingFaceHub()
    listing = hub.list_files(name)
    family, files = _family_files(name, listing, FAMILIES)
    wanted = files.wanted(listing)
    log.info("%s: %s model, %d of the repository's %d files", name, family.title, len(wanted), len(listing))
    folder = hub.download(name, wanted)
    missing = files.missing(folder_files(folder))
    if missing:  # e.g. an offline cache holding part of a download
        raise CheckpointError(f"{TITLES[name.hub]} model {name}: the local copy in {folder} lacks "
                              f"{', '.join(missing)}; run again online to complete it")
    return folder


def _family_files(name: HubName, listing: set[str], families):
    """The first family whose required files the repository has, with its ``ReleaseFiles``."""
    gaps = []
    for family in families:
        files = family.release_files()
        if files is None:
            continue
        missing = files.missing(listing)
        if not missing:
            return family, files
        gaps.append(f"{family.title} needs {', '.join(missing)}")
    raise CheckpointError(f"{TITLES[name.hub]} repository {name} is not a model folder Cadenza can load: "
                          f"{'; '.join(gaps)} (not in the repository)")


def folder_name(directory: str | os.PathLike) -> str:
    """A model folder's name: the repository's name for a hub cache snapshot (``CosyVoice2-0.5B`` for
    Hugging Face's ``.../models--FunAudioLLM--CosyVoice2-0.5B/snapshots/<commit>`` and ModelScope's
    ``.../models/iic--CosyVoice2-0.5B/snapshots/<revision>``), else the folder's own name."""
    directory = Path(directory)
    if directory.parent.name == "snapshots":
        repo = directory.parent.parent
        match = _SNAPSHOT.fullmatch(repo.name)
        if match:
            return match["name"]
        if repo.parent.name == "models" and "--" in repo.name:
            return repo.name.split("--", 1)[1]
    return directory.name


def _require(hub: str):
    module, extra = EXTRAS[hub]
    try:
        return __import__(module)
    except ImportError as exc:
        raise MissingDependencyError(f"downloading {TITLES[hub]} models needs the '{extra}' extra ({module} is "
                                     f"missing): pip install 'cadenza[{extra}]'; or pass a local model folder") \
            from exc


class HuggingFaceHub:
    """``huggingface_hub``'s client with its defaults: the cache, endpoint, offline switch and token it reads from
    the environment, and its progress bars. A transfer that breaks off is resumed from where it stopped (a ranged
    request; files already complete are kept)."""

    def __init__(self) -> None:
        _require(HUGGINGFACE)

    def list_files(self, name: HubName) -> set[str]:
        from huggingface_hub import HfApi
        from huggingface_hub import errors as hf_errors

        try:
            info = HfApi().model_info(name.repo_id, revision=name.revision or "main")
            return {s.rfilename for s in info.siblings or ()}
        except hf_errors.RevisionNotFoundError as exc:
            raise CheckpointError(f"Hugging Face repository {name.repo_id} has no revision {name.revision!r}") \
                from exc
        except hf_errors.GatedRepoError as exc:
            raise CheckpointError(f"Hugging Face repository {name.repo_id} is gated: accept its terms on the hub "
                                  "and log in (HF_TOKEN)") from exc
        except hf_errors.RepositoryNotFoundError as exc:
            raise CheckpointError(f"no model folder {str(name)!r} here and no Hugging Face repository "
                                  f"{name.repo_id!r} ({_endpoint()}): check the name, or log in (HF_TOKEN) for a "
                                  "private one") from exc
        except Exception as exc:  # noqa: BLE001 - offline or unreachable: the cache may still have it
            cached = self._cached_listing(name)
            if cached is None:
                raise CheckpointError(f"Hugging Face model {name} is not in the cache ({_cache()}) and the hub "
                                      f"cannot be reached ({_reason(exc)})") from exc
            return cached

    def _cached_listing(self, name: HubName) -> set[str] | None:
        """The file list an earlier download recorded in the cache (huggingface_hub >= 1.x keeps the repository's
        tree), else the files of the cached snapshot; None when the revision was never downloaded."""
        import huggingface_hub

        revision = name.revision or "main"
        try:
            cached_tree = getattr(huggingface_hub, "get_cached_repo_tree", None)
            if cached_tree is not None:
                return {f.path for f in cached_tree(name.repo_id, revision=revision)}
            folder = huggingface_hub.snapshot_download(name.repo_id, revision=revision, local_files_only=True)
            return folder_files(Path(folder))
        except Exception:  # noqa: BLE001 - nothing recorded for this revision
            return None

    def download(self, name: HubName, files: list[str]) -> Path:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(name.repo_id, revision=name.revision or "main", allow_patterns=files))
        except Exception as exc:  # noqa: BLE001 - the client's many error types become one message
            raise CheckpointError(f"downloading Hugging Face model {name} stopped: {_reason(exc)}; run again to "
                                  "resume (files already downloaded are kept)") from exc


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _reason(exc: BaseException) -> str:
    """The first line of an exception's message, with its type."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__
