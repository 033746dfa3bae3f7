"""Multipart forms (voice uploads, LoRA uploads, watermark detection), read one way with specific errors.

Text fields are decoded strictly: Starlette decodes a field that is not valid in the form's charset (UTF-8 unless
the request names another) as Latin-1 instead, so a consent statement or transcript sent in another encoding was
stored garbled without a word. Here it is a 400 naming the field and the first bad byte.
"""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser

from cadenza.server.errors import APIError


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


async def read_form(request: Request, *, max_files: int, max_fields: int, not_multipart: str) -> FormData:
    """The request's multipart form. 415 with the message ``not_multipart`` (what to send) when the body is not
    multipart/form-data; 400 ``invalid_form`` when it does not parse (no boundary, too many files or fields, no
    closing boundary), 400 ``invalid_encoding`` for a text field in another encoding; the body-size limit's 413
    passes through. The caller closes the form (its files are spooled to disk past 1 MB)."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise APIError(415, not_multipart, code="unsupported_media_type")
    parser = StrictMultiPartParser(request.headers, request.stream(), max_files=max_files, max_fields=max_fields)
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
    return form
