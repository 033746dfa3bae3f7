"""Markdown markup dropped from text that arrives in pieces (an LLM's tokens), for an LM that reads them as they come.

Whole texts lose their Markdown in ``normalize`` (``cadenza.text.normalize.markdown``); a bi-streaming LM reads the
pieces themselves, so this filter does the same as they pass, holding back only what the next piece decides:

* emphasis markers: runs of two or more ``*``, ``_`` or ``~``, and a single ``*`` or ``_`` with a word character
  on one side only (``*word*``, ``_word_``); ``2*3``, ``snake_case`` and ``a * b`` stay;
* backticks (the code's text stays); code-fence lines (```` ```python ````) go whole;
* at a line start: heading marks, block quotes, bullets (``-`` ``*`` ``+`` ``•``) and rules (``---``).

Links are left as written (their text and address arrive in separate pieces; the whole-text path reads their text).
Held back: a trailing run of markers (is the next character a letter?) and a line start holding markers only (a
heading, a bullet or a rule?) — at most ``MAX_HELD`` characters, then they pass as they are.
"""

from __future__ import annotations

import re

from cadenza.text.normalize.markdown import FENCE_START, LINE_MARK, RULE_LINE

MAX_HELD = 256

_LINE_MARK = re.compile(LINE_MARK)
_RULE = re.compile(RULE_LINE)
_FENCE = re.compile(FENCE_START)
_UNDECIDED_LINE = re.compile(r" ?[-#>+*•~`_ ]*")  # a line start that may still become a heading, bullet, fence, rule
_MARKERS = re.compile(r"[*_~`]+")


class MarkdownStream:
    """``feed(piece) -> text`` and ``flush() -> text``: the pieces' text without Markdown markup (see the module)."""

    def __init__(self) -> None:
        self._held = ""
        self._prev = ""  # the last character passed on
        self._line_start = True  # the held text starts a line

    def feed(self, piece: str) -> str:
        return self._settle(self._held + piece, final=False)

    def flush(self) -> str:
        return self._settle(self._held, final=True)

    # -- internals ---------------------------------------------------------------------------------------------------
    def _settle(self, text: str, final: bool) -> str:
        self._held = ""
        if not final:
            cut = self._undecided_from(text)
            if len(text) - cut > MAX_HELD:
                cut = len(text)
            text, self._held = text[:cut], text[cut:]
        out = self._lines(text, final)
        nxt = self._held[:1] if not final else ""
        out = self._inline(out, nxt)
        if out:
            self._prev = out[-1]
        return out

    def _undecided_from(self, text: str) -> int:
        """Where the text the next piece may still change begins (``len(text)``: none)."""
        start = text.rfind("\n") + 1
        if start > 0 or self._line_start:
            line = text[start:]
            if _UNDECIDED_LINE.fullmatch(line) or _FENCE.match(line):
                return start
        end = len(text)
        while end > 0 and text[end - 1] in "*_~`":
            end -= 1
        return end

    def _lines(self, text: str, final: bool) -> str:
        """Line-start markup of each line ``text`` starts (its first line only if it begins a line)."""
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if i == 0 and not self._line_start:
                continue
            complete = i < len(lines) - 1 or final
            mark = _LINE_MARK.match(line)
            if complete and (_FENCE.match(line) or _RULE.fullmatch(line)):
                lines[i] = ""
            elif mark:
                lines[i] = line[mark.end():]
        if text:
            self._line_start = text.endswith("\n")
        return "\n".join(lines)

    def _inline(self, text: str, nxt: str) -> str:
        """``text`` without emphasis markers and backticks; ``self._prev`` and ``nxt`` are its neighbours."""
        context = self._prev + text + nxt
        offset = len(self._prev)
        out, pos = [], 0
        for m in _MARKERS.finditer(text):
            a, b = m.start() + offset, m.end() + offset
            run = m.group()
            before = context[a - 1] if a > 0 else ""
            after = context[b] if b < len(context) else ""
            if run == "~" or (run in ("*", "_") and before.isalnum() == after.isalnum()):
                continue  # ~5, 2*3, snake_case, a * b: not emphasis
            out.append(text[pos:m.start()])
            pos = m.end()
        out.append(text[pos:])
        return "".join(out)
