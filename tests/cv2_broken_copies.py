"""Broken copies of model folders, for the loader's hostile-input tests (tests/models/cosyvoice2/
test_loader_hostile_*.py): unchanged files are linked from the fixture (or the built-in model), the file under test
is written for real; ``load_fails`` expects a ``CheckpointError`` naming what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cadenza import Cadenza, CheckpointError

WEIGHTS = ("llm.pt", "flow.pt", "hift.pt")


def copy_model(src: Path, dst: Path, write: dict[str, bytes | str | None] | None = None) -> Path:
    """``dst`` with every file of ``src`` linked, except those in ``write``: bytes/str are written, None removes the
    file, ``"<dir>"`` puts a directory in its place."""
    write = write or {}
    for f in src.rglob("*"):
        if f.is_file():
            rel = f.relative_to(src).as_posix()
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel not in write:
                os.symlink(f.resolve(), dst / rel)
    for rel, content in write.items():
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if content == "<dir>":
            target.mkdir()
        elif isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        elif content is not None:
            target.write_bytes(content)
    return dst


def fixture_copy(cv2_dir: Path, dst: Path, write=None) -> Path:
    """The fixture's model files only (not its .npz test cases)."""
    src = dst.parent / (dst.name + "_src")
    (src / "CosyVoice-BlankEN").mkdir(parents=True)
    for rel in ("config.yaml", *WEIGHTS, "CosyVoice-BlankEN/config.json"):
        os.symlink(cv2_dir / rel, src / rel)
    return copy_model(src, dst, write)


def load_fails(directory: Path, *needles: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as err:
        Cadenza.from_pretrained(directory).close()
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    return err.value

