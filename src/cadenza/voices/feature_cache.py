"""``FileFeatureCache``: prompt features a model computed from a voice, as files beside an SQLite voice store.

Layout: ``<root>/<voice id>/<model key>.safetensors``. Files are written to a temporary name and renamed into place,
so a reader sees either no file or a whole one. A voice's *name* never reaches the filesystem: paths are built only
from ids the store generated and re-validated (``voice_`` + 22 URL-safe characters) and from model keys of a strict
format. (The PostgreSQL backend keeps these features in its ``prompt_cache`` table instead: replicas on several
machines share no folder.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from cadenza.voices.validation import validate_model_key, validate_voice_id

TMP_PREFIX = ".tmp-"


class FileFeatureCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, voice_id: str, model_key: str) -> Path:
        return self.root / validate_voice_id(voice_id) / f"{validate_model_key(model_key)}.safetensors"

    def read(self, voice_id: str, model_key: str) -> bytes | None:
        try:
            return self.path(voice_id, model_key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write(self, voice_id: str, model_key: str, data: bytes) -> None:
        path = self.path(voice_id, model_key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def drop(self, voice_id: str, model_key: str) -> None:
        self.path(voice_id, model_key).unlink(missing_ok=True)

    def remove(self, voice_id: str) -> None:
        """Every cached feature of a voice."""
        shutil.rmtree(self.root / validate_voice_id(voice_id), ignore_errors=True)

    def sweep_temporaries(self, older_than_s: float = 3600.0) -> None:
        """Remove files a killed writer left half-written (``.tmp-*``; never read). Only old ones: another process
        sharing the folder may be writing a fresh one right now."""
        cutoff = time.time() - older_than_s
        for path in self.root.glob(f"*/{TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
