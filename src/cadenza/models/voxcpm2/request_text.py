"""The text of one VoxCPM 2 request: clean-up, optional normalisation, voice-design description, checks.

Voice design is not a separate model mode (docs/design.md, "VoxCPM 2 sequence layouts"): a description in parentheses at
the very start of the text, ``"(A calm, deep male voice)Hello there."``, steers the voice. We recognise it only to
validate the request (a description next to a continuation prompt is refused, as the reference CLI refuses ``--control``
with a prompt transcript) and to keep it out of normalisation; the model always reads the text exactly as given (after
the reference's whitespace clean-up).

Checks beyond the reference (which only rejects blank text): the spoken part must hold at least one letter or digit
(``"..."`` or an emoji alone gives the model nothing to say); emoji and other symbols inside speakable text are
kept (the tokenizer maps them to byte tokens) and never crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cadenza.errors import TextError
from cadenza.models.voxcpm2.text import clean_text

# "(description)" at the start: no nested or unbalanced parentheses, at least one letter inside.
DESCRIPTION_RE = re.compile(r"\A\s*(\((?=[^()\n]*[^\W\d_])[^()\n]*\))")


@dataclass(frozen=True)
class RequestText:
    text: str  # what the model reads (description included)
    description: str | None  # the voice-design description without parentheses, or None
    spoken: str  # the part to be spoken

    @property
    def is_voice_design(self) -> bool:
        return self.description is not None


def split_description(text: str) -> tuple[str | None, str]:
    """``"(calm)Hi"`` -> ``("calm", "Hi")``; text without a leading description -> ``(None, text)``."""
    m = DESCRIPTION_RE.match(text)
    if m is None:
        return None, text
    return m.group(1)[1:-1].strip(), text[m.end(1):]


def is_speakable(text: str) -> bool:
    return any(c.isalnum() for c in text)


def prepare_text(text: str, normalize: bool = False) -> RequestText:
    """Clean (``text.clean_text``), optionally normalise the spoken part, split off a description, check.

    ``normalize=True`` runs ``cadenza.text.normalize`` (numbers, dates, units... -> words; English and Chinese) on
    the spoken part only. The reference uses wetext + inflect here; outputs differ in places (see docs/voxcpm2.md).
    """
    if not isinstance(text, str):
        raise TextError(f"text must be a string, got {type(text).__name__}")
    text = clean_text(text)
    description, spoken = split_description(text)
    if normalize:
        from cadenza.text.normalize import normalize as normalize_text

        head = text[: len(text) - len(spoken)]
        spoken = normalize_text(spoken) if spoken.strip() else spoken
        text = head + spoken
    if description is not None and not spoken.strip():
        raise TextError(f"the text holds only a voice description ({description!r}): add the words to speak after it")
    if not is_speakable(spoken):
        raise TextError(f"the text {spoken.strip()!r} has nothing to speak: it needs at least one letter or digit")
    return RequestText(text=text, description=description, spoken=spoken)


def prepare_prompt_text(prompt_text: str) -> str:
    """The transcript of continuation audio, with the same whitespace clean-up as the target text (the reference
    leaves it as given; newlines inside a transcript only confuse the model)."""
    if not isinstance(prompt_text, str) or not prompt_text.strip():
        raise TextError("prompt_text must be the non-empty transcript of prompt_wav")
    return clean_text(prompt_text)
