"""Which files of a released model folder a family reads: the ones it cannot load without, and the ones it uses when
present. Checked against a folder or against a repository's file list (``cadenza.loading.hub`` downloads only
these), so a missing file is named before anything is read or downloaded."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReleaseFiles:
    """``required``: one entry per needed file, each a tuple of alternative paths (the first one present is read,
    e.g. ``("model.safetensors", "pytorch_model.bin")``); ``optional``: paths read when present. Paths are relative,
    with ``/`` separators, as in a repository listing."""

    required: tuple[tuple[str, ...], ...]
    optional: tuple[str, ...] = ()

    def missing(self, names: Collection[str]) -> list[str]:
        """The required entries none of whose alternatives is in ``names`` (``"a or b"`` for alternatives)."""
        return [" or ".join(alternatives) for alternatives in self.required
                if not any(a in names for a in alternatives)]

    def wanted(self, names: Collection[str]) -> list[str]:
        """The files of ``names`` the family reads: the first present alternative of each required entry (the others
        would never be opened) and every optional file present."""
        chosen = [next(a for a in alternatives if a in names) for alternatives in self.required
                  if any(a in names for a in alternatives)]
        return chosen + [n for n in self.optional if n in names and n not in chosen]


def folder_files(directory: Path) -> set[str]:
    """The relative paths (``/``-separated) of the regular files under ``directory`` (links followed)."""
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}
