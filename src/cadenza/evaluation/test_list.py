"""Reading a Seed-TTS-eval test list (``meta.lst``).

One utterance per line, fields separated by ``|`` (or, when a line has no ``|``, by TABs)::

    utt_id|prompt_text|prompt_wav|target_text
    utt_id|prompt_text|prompt_wav|target_text|target_wav

* ``utt_id`` names the output (``<utt_id>.wav``): letters, digits, ``_ - . +`` only, unique in the list.
* ``prompt_text`` is the transcript of ``prompt_wav``; it may be empty (the prompt is then used without transcript:
  cross-lingual mode in CosyVoice 2, a reference voice in VoxCPM 2).
* ``prompt_wav`` is relative to the list file (or absolute). Empty means "no prompt": plain synthesis with the
  model's default voice or ``--speaker``; the prompt text must then be empty too, and there is no similarity.
* ``target_text`` is what to say, and the reference for WER.
* ``target_wav`` (optional, Seed-TTS-eval's 5-column lists): a recording of the target text, relative to the list
  file. ``cadenza eval --ground-truth`` scores these to measure the ASR on real speech.

Blank lines and lines starting with ``#`` are skipped. A malformed line raises ``InputError`` naming its number.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cadenza.errors import InputError
from cadenza.evaluation.wer import words

_UTT_ID = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]*")
MAX_LIST_BYTES = 64 * 2**20  # far beyond any test set (Seed-TTS-eval en: ~1,100 lines, 300 kB)


@dataclass(frozen=True)
class TestItem:
    """One line of a test list; paths are resolved against the list file's folder."""

    __test__ = False  # not a pytest test class, despite the name

    utt_id: str
    prompt_text: str
    prompt_wav: Path | None
    target_text: str
    target_wav: Path | None = None
    line: int = 0  # 1-based line number in the list file (for messages)

    @property
    def where(self) -> str:
        return f"line {self.line} ({self.utt_id})"


def _resolve(base: Path, field: str) -> Path | None:
    return None if not field else (base / Path(field).expanduser())


def parse_line(line: str, number: int, base: Path) -> TestItem:
    """Parse one non-blank, non-comment line. ``base`` is the folder that relative paths start from."""
    sep = "|" if "|" in line else "\t"
    fields = [f.strip() for f in line.split(sep)]
    if len(fields) not in (4, 5):
        raise InputError(f"line {number}: expected 4 fields 'utt_id|prompt_text|prompt_wav|target_text' "
                         f"(or 5 with target_wav), got {len(fields)}")
    utt_id, prompt_text, prompt_wav, target_text = fields[:4]
    target_wav = fields[4] if len(fields) == 5 else ""
    if not _UTT_ID.fullmatch(utt_id):
        raise InputError(f"line {number}: utt_id {utt_id!r} must be letters, digits and '_-.+' "
                         "(it becomes a file name), not starting with '.'")
    if not words(target_text):
        raise InputError(f"line {number} ({utt_id}): the target text is empty")
    if not prompt_wav and prompt_text:
        raise InputError(f"line {number} ({utt_id}): a prompt text without prompt_wav (leave both empty for "
                         "synthesis without a prompt)")
    return TestItem(utt_id=utt_id, prompt_text=prompt_text, prompt_wav=_resolve(base, prompt_wav),
                    target_text=target_text, target_wav=_resolve(base, target_wav), line=number)


def read_test_list(path: str | os.PathLike) -> list[TestItem]:
    """Read and validate a test list. Raises ``InputError`` for an unreadable file, a malformed line, a duplicate
    ``utt_id`` or a list without utterances. Files are not checked here (see ``runner.check_inputs``)."""
    path = Path(path).expanduser()
    try:
        if path.stat().st_size > MAX_LIST_BYTES:
            raise InputError(f"test list {path} is larger than {MAX_LIST_BYTES // 2**20} MiB")
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a byte-order mark from Windows editors
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read test list {path}: {exc}") from exc
    base = path.resolve().parent
    items: list[TestItem] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines(): it also splits at U+2028 etc.
        line = line.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = parse_line(line, number, base)
        if item.utt_id in seen:
            raise InputError(f"line {number}: utt_id {item.utt_id!r} already used on line {seen[item.utt_id]}")
        seen[item.utt_id] = number
        items.append(item)
    if not items:
        raise InputError(f"test list {path} has no utterances")
    return items
