"""Watermark keys: Cadenza's public default, or an operator's own key file (docs/provenance.md, "Keys").

The default key is in this source, so a mark made with it proves only "made with Cadenza's default key": anyone
can look for it, and anyone could also add it to other audio or try to remove it. An operator who wants marks
that only they can read (or forge) keeps a key file of their own secret: any bytes, 16 to 4096 of them, e.g.
``head -c 32 /dev/urandom > cadenza.key``. The file's bytes are the key exactly as they are (a trailing newline
included), so embedding and detection must read the same file.
"""

from __future__ import annotations

import os

from cadenza.errors import InputError

DEFAULT_KEY = b"cadenza provenance watermark, public key v1"
MIN_KEY_BYTES, MAX_KEY_BYTES = 16, 4096


def load_key(path: str | os.PathLike) -> bytes:
    """The key in the file at ``path`` (its raw bytes). ``InputError`` if it cannot be read or has the wrong size."""
    try:
        with open(path, "rb") as f:
            key = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read key file {os.fspath(path)!r}: {exc.strerror or exc}") from exc
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InputError(f"key file {os.fspath(path)!r} must hold {MIN_KEY_BYTES}-{MAX_KEY_BYTES} bytes, got "
                         f"{'more' if len(key) > MAX_KEY_BYTES else len(key)}")
    return key
