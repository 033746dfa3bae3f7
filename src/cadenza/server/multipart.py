"""Multipart forms (voice uploads, voice conversion, LoRA uploads, watermark detection), read one way with specific
errors; uploaded audio read within its limits and decoded whatever the container (``read_audio_file``,
``decode_upload``).

Text fields are decoded strictly: Starlette decodes a field that is not valid in the form's charset (UTF-8 unless
the request names another) as Latin-1 instead, so a consent statement or transcript sent in another encoding was
stored garbled without a word. Here it is a 400 naming the field and the first bad byte.
"""

from __future__ import annotations

import torch
from fastapi import Request
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from cadenza.audio.io import decode_audio
from cadenza.server.errors import APIError
from cadenza.voices.validation import decode_prompt


class StrictMultiPartParser(MultiPartParser):
    """Starlette's parser, refusing text fields that do not decode in the form's charset, and noting whether the
    closing boundary came (python-multipart drops a truncated last part without a word)."""

    complete = False

    def on_end(self) -> None:
        self.complete = True

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset)  # values are small (at most max_part_size, 1 MB)
            except UnicodeDecodeError as exc:
                raise APIError(400, f"form field {part.field_name[:64]!r} is not valid {self._charset}: byte "
                               f"0x{part.data[exc.start]:02x} at offset {exc.start} (send text fields in UTF-8)",
                               param=part.field_name[:64], code="invalid_encoding") from None
        super().on_part_end()


async def read_form(request: Request, *, fields: tuple[str, ...], max_files: int, not_multipart: str) -> FormData:
    """The request's multipart form of the endpoint's ``fields``. 415 with the message ``not_multipart`` (what to
    send) when the body is not multipart/form-data; 400 ``invalid_form`` when it does not parse (no boundary, too many
    files or fields, no closing boundary), 400 ``invalid_encoding`` for a text field in another encoding, 400
    naming a field the endpoint does not take (a misspelt ``transcript`` would silently be no transcript) or one
    given twice (which one counts would be a guess); the body-size limit's 413 passes through. The caller closes the
    form (its files are spooled to disk past 1 MB)."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise APIError(415, not_multipart, code="unsupported_media_type")
    parser = StrictMultiPartParser(request.headers, request.stream(), max_files=max_files,
                                   max_fields=len(fields) + 2)  # room to name a stray or doubled field
    try:
        form = await parser.parse()
    except APIError:
        raise
    except MultiPartException as exc:
        raise APIError(400, f"cannot parse the multipart form: {exc.message}", code="invalid_form") from exc
    except Exception as exc:  # the body-size limit raises an HTTPException with 413: let it through
        if getattr(exc, "status_code", None) == 413:
            raise
        raise APIError(400, f"cannot parse the multipart form: {exc}", code="invalid_form") from exc
    if not parser.complete:
        await form.close()
        raise APIError(400, "the multipart form ends before its closing boundary (a truncated upload?)",
                       code="invalid_form")
    given = [name for name, _ in form.multi_items()]
    unknown = next((name for name in given if name not in fields), None)
    twice = next((name for name in given if given.count(name) > 1), None)
    if unknown is not None or twice is not None:
        await form.close()
        if unknown is not None:
            raise APIError(400, f"unknown form field {unknown[:64]!r}; the fields are {', '.join(fields)}",
                           param=unknown[:64], code="unknown_parameter")
        raise APIError(400, f"form field {twice[:64]!r} is given {given.count(twice)} times: give it once",
                       param=twice[:64], code="invalid_value")
    return form


def text_field(form: FormData, name: str, required: bool = False, what: str | None = None) -> str | None:
    """A text field of the form (None when absent): 400 when it is a file, or absent and ``required`` (``what`` says
    what it is, in the message)."""
    value = form.get(name)
    if value is None:
        if required:
            raise APIError(400, f"missing form field '{name}': {what or name} is required", param=name,
                           code="missing_field")
        return None
    if not isinstance(value, str):
        raise APIError(400, f"form field '{name}' must be text, not a file", param=name, code="invalid_value")
    return value


def bool_field(form: FormData, name: str, default: bool) -> bool:
    """A ``true``/``false`` (or ``1``/``0``) field; ``default`` when absent; 400 naming it otherwise."""
    value = text_field(form, name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false", "1", "0"):
        raise APIError(400, f"{name} is true or false", param=name, code="invalid_value")
    return value.strip().lower() in ("true", "1")


async def read_audio_file(form: FormData, fields: tuple[str, ...], limit: int) -> bytes:
    """The bytes of the form's audio file (the first of ``fields`` present): 400 when it is missing, not a file or
    empty, 413 past ``limit`` bytes (no more than ``limit + 1`` are read)."""
    upload = next((form[f] for f in fields if f in form), None)
    if not isinstance(upload, UploadFile):
        raise APIError(400, f"missing the audio file (multipart file field '{fields[0]}')", param=fields[0],
                       code="missing_field")
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise APIError(413, f"the audio file is larger than the {limit / 2**20:.1f} MiB limit", param=fields[0],
                       code="file_too_large")
    if not data:
        raise APIError(400, "the audio file is empty", param=fields[0], code="invalid_audio")
    return data


def decode_upload(data: bytes, max_bytes: int, max_seconds: float, **wording) -> tuple[torch.Tensor, int]:
    """Blocking: an uploaded recording -> validated mono float32 ``[N]`` and its rate (``decode_prompt``'s checks:
    at most ``max_seconds``, not silent, not too short). Decoded at its own rate by ``decode_audio``, the one decode
    path of every audio reader (libsndfile or, for what it lacks -- m4a, WebM, AAC --, FFmpeg). Raises
    ``AudioError`` naming what is wrong (``wording``: ``what`` and ``shorten``, as ``decode_prompt``'s)."""
    samples, rate = decode_audio(data, max_bytes, max_seconds=max_seconds)
    return decode_prompt((samples, rate), max_seconds=max_seconds, **wording)
