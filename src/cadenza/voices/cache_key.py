"""The model key under which a voice's computed prompt features are cached.

Prompt features depend on the frontend files (speaker encoder, speech tokenizer, text tokenizer for the transcript
ids, the config's mel settings), so the key fingerprints those files: their names, sizes and modification times
(hashing the 500 MB speech tokenizer on every start would be slow; replacing a file changes its size or mtime).
Saved speakers (``spk2info.pt``) are deliberately left out: adding one must not invalidate the cache.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

# Bump when the cached feature layout or the way features are computed changes.
PROMPT_FEATURES_VERSION = 1


def prompt_cache_key(files: Iterable[str | os.PathLike | None], family: str = "cv2") -> str:
    """A short key (``<family>-<16 hex>``, safe as a file name) fingerprinting ``files`` (``None`` entries and
    missing files count as absent). For CosyVoice 2 pass the frontend's files, e.g.
    ``prompt_cache_key(cosyvoice2_frontend_files(tts.engine.frontend.files))``."""
    digest = hashlib.sha256(f"v{PROMPT_FEATURES_VERSION}".encode())
    for f in files:
        if f is None:
            digest.update(b"\0absent")
            continue
        path = Path(f)
        try:
            st = path.stat()
            digest.update(f"\0{path.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        except OSError:
            digest.update(f"\0{path.name}\0absent".encode())
    return f"{family}-{digest.hexdigest()[:16]}"


def cosyvoice2_frontend_files(files) -> list[Path | None]:
    """The files of a ``CosyVoice2Files`` that the prompt features depend on."""
    tok = files.tokenizer_dir
    return [files.config, files.qwen_config, files.campplus, files.speech_tokenizer,
            tok / "vocab.json" if tok else None, tok / "merges.txt" if tok else None]
