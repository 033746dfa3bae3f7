"""Model names -> model folders: a local folder, or a hub repository downloaded into its cache.

Every entry point (``cadenza.load``, ``Cadenza.from_pretrained``, ``VoxCPM2.from_pretrained``, the CLI's ``--model``,
``cadenza serve --model [NAME=]...``) resolves its model through ``cadenza.builtin.resolve_model_path``, which
answers ``None`` and ``"cadenza-tiny"`` with the built-in model and hands every other name to ``locate_model``:

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
from pathlib import Path

from cadenza.errors import CheckpointError, InputError
from cadenza.loading.families import FAMILIES
from cadenza.loading.hf_hub import HuggingFaceHub
from cadenza.loading.hub_names import MODELSCOPE, REVISION_PATTERN, TITLES, HubName, parse_hub_name
from cadenza.loading.modelscope_hub import ModelScopeHub
from cadenza.loading.release_files import folder_files

log = logging.getLogger(__name__)

# <cache>/models--owner--name/snapshots/<commit>: the layout of huggingface_hub's cache.
_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)")




def locate_model(path: str | os.PathLike | None, revision: str | None = None) -> Path:
    """The folder of the model ``path`` names (see the module's docstring); downloads a hub repository that is not
    yet complete in the cache. ``revision``: the branch, tag or commit of a hub name (``name@rev`` says the same)."""
    if revision is not None and (not isinstance(revision, str) or REVISION_PATTERN.fullmatch(revision) is None
                                 or ".." in revision):
        raise InputError(f"revision must be a branch, tag or commit name, got {str(revision)[:80]!r}")
    if path is None:
        raise InputError("no model given: a model folder or a hub name (owner/name) is needed")
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
    hub = ModelScopeHub() if name.hub == MODELSCOPE else HuggingFaceHub()
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
