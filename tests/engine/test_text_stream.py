"""Text that arrives piece by piece: ``complete_prefix``, open-ended ``SegmentStream`` and ``SentenceTextStream``
(over a fake submit that turns each request's text into recognisable audio), and ``TokenTextStream``'s feeding."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cadenza.engine.long_form import SegmentStream
from cadenza.engine.text_stream import MAX_PENDING_CHARS, SentenceTextStream, TokenTextStream
from cadenza.text.segment import complete_prefix


class _Handle:
    def __init__(self, text: str) -> None:
        self.text, self.cancelled = text, False

    def __iter__(self):
        for ch in self.text:  # one chunk per character: its code point
            yield np.array([ord(ch)], dtype=np.float32)

    def cancel(self) -> None:
        self.cancelled = True


def _decode(chunks) -> str:
    return "".join(chr(int(c[0])) for c in chunks)


@pytest.mark.parametrize("text, done", [
    ("Hello there. How", "Hello there."), ("Hello there.", ""), ("Dr. Smith is", ""), ("It costs 3.", ""),
    ("It costs 3.14 now. And", "It costs 3.14 now."), ("你好。我", "你好。"), ("Wow! Yes? No", "Wow! Yes?"),
    ("e.g. this", ""), ("one\ntwo", "one"), ("", ""), ("   ", ""),
])
def test_complete_prefix(text, done):
    assert text[: complete_prefix(text)] == done


def test_an_open_ended_segment_stream_waits_for_more_and_ends_on_end():
    handles = []

    def submit(text, stream):
        handles.append(_Handle(text))
        return handles[-1]

    segments = SegmentStream(submit, ["ab"], window=1, open_ended=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(segments))
    reader.start()
    segments.add(["cd"])
    segments.add(["e"])
    assert reader.is_alive()  # no end yet: it waits
    segments.end()
    reader.join(10)
    assert not reader.is_alive() and _decode(out) == "abcde"
    with pytest.raises(RuntimeError):
        segments.add(["late"])


def test_failing_and_cancelling_an_open_ended_stream():
    segments = SegmentStream(lambda text, stream: _Handle(text), [], open_ended=True)
    segments.fail(ValueError("the writer failed"))
    with pytest.raises(ValueError, match="writer failed"):
        next(segments)
    waiting = SegmentStream(lambda text, stream: _Handle(text), [], open_ended=True)
    reader = threading.Thread(target=lambda: list(waiting))
    reader.start()
    waiting.cancel()  # wakes the waiting reader
    reader.join(10)
    assert not reader.is_alive()


def test_sentences_are_spoken_in_order_once_complete():
    made: list[tuple[str, int]] = []

    def make(text: str, index: int) -> list[str]:
        made.append((text, index))
        return [text.strip()] if text.strip(" .") else []

    stream = SentenceTextStream(lambda text, stream: _Handle(text), make)
    stream.feed("Hello the")
    assert made == []
    stream.feed("re. How are")
    assert made == [("Hello there.", 0)]
    first = next(iter(stream))  # the first sentence's audio is there before the text ends
    assert _decode([first]) == "H"
    stream.feed(" you? ...")
    stream.end()
    assert "H" + _decode(list(stream)) == "Hello there.How are you?"  # "..." alone has nothing to speak
    assert made == [("Hello there.", 0), (" How are you?", 1), (" ...", 2)]


def test_a_long_run_without_a_sentence_end_is_cut():
    made = []
    stream = SentenceTextStream(lambda text, stream: _Handle(text), lambda t, i: made.append(t) or [t])
    stream.feed("word " * (MAX_PENDING_CHARS // 5 + 20))
    assert made and all(len(t) <= MAX_PENDING_CHARS for t in made)
    stream.cancel()


def test_errors_of_the_request_maker_reach_the_writer():
    def make(text, index):
        raise ValueError("too long")

    stream = SentenceTextStream(lambda text, stream: _Handle(text), make)
    with pytest.raises(ValueError, match="too long"):
        stream.feed("One sentence. Two")


def test_token_text_stream_feeds_ids_and_ends():
    class Encoder:
        def __init__(self):
            self.held = ""

        def feed(self, text):
            out, self.held = [ord(c) for c in self.held], text[-1:]
            return out + [ord(c) for c in text[:-1]]

        def flush(self):
            out, self.held = [ord(c) for c in self.held], ""
            return out

    class Handle:
        def __init__(self):
            self.fed, self.ended = [], False

        def feed_text(self, ids):
            self.fed.extend(ids[0].tolist())

        def end_text(self):
            self.ended = True

    handle = Handle()
    stream = TokenTextStream(handle, Encoder())
    stream.feed("ab")
    stream.feed("cd")
    stream.end()
    assert "".join(map(chr, handle.fed)) == "abcd" and handle.ended
