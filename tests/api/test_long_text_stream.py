"""A book read aloud: ``synthesize_stream`` of a text past ``LAZY_PLAN_CHARS`` plans it a block at a time as it is
spoken. With the built-in model (one sentence per segment) the segments, their ids and seeds are exactly those of the
whole text planned at once, so the audio is too; the first audio waits for the first block only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cadenza
from cadenza.api import request_batches as planning
from cadenza.engine.long_form import stream_segments
from cadenza.errors import TextError

SENTENCES = [line.strip() for line in
             (Path(__file__).resolve().parents[2] / "recipes/tiny/lists/everyday_test.txt").read_text().splitlines()
             if line.strip()]


def _book(paragraphs: int) -> str:
    extra = "Dr. Smith paid $3.14 at 5 p.m. on Jan. 5th, 2024. "
    return "\n\n".join(" ".join(SENTENCES[(6 * i) % 114:(6 * i) % 114 + 6]) + (" " + extra if i % 3 == 0 else "")
                       for i in range(paragraphs))


@pytest.fixture(scope="module")
def tiny():
    tts = cadenza.load()
    yield tts
    tts.close()


def test_blocks_plan_exactly_what_the_whole_text_plans(tiny):
    text = _book(60)
    whole = tiny.requests(text, seed=4)
    blocks = list(planning.request_batches(tiny, text, block_chars=700, seed=4))
    flat = [r for b in blocks for r in b]
    assert len(blocks) > 10 and len(flat) == len(whole)
    for a, b in zip(whole, flat):
        assert a.seed == b.seed and a.text_ids.equal(b.text_ids)


def test_a_long_text_streams_what_the_whole_plan_streams_and_plans_as_it_goes(tiny, monkeypatch):
    text = _book(260)
    assert len(text) > planning.LAZY_PLAN_CHARS
    planned = []
    real_segments = tiny.segments

    def counting(block, normalize=True, max_tokens=None):
        planned.append(len(block))
        return real_segments(block, normalize, max_tokens)

    monkeypatch.setattr(tiny, "segments", counting)
    lazy = tiny.synthesize_stream(text, seed=1)
    head = [next(lazy) for _ in range(4)]
    assert len(planned) == 1 and sum(planned) < len(text) / 3  # the first block only, before any audio
    lazy.close()
    # the same requests planned whole, streamed and marked as synthesize_stream does: the same audio
    eager = tiny.mark.stream(stream_segments(tiny.engine.scheduler.submit, tiny.requests(text, seed=1)))
    expected = [next(eager) for _ in range(4)]
    eager.close()
    np.testing.assert_array_equal(np.concatenate(head), np.concatenate(expected))


def test_errors_in_the_first_block_come_before_any_audio(tiny):
    """The first block is planned at the call, its errors too (a later block's other errors come when its turn
    comes, after the audio before it: tests/engine/test_stream_planned.py)."""
    with pytest.raises(TextError, match="script"):
        tiny.synthesize_stream("我有三个苹果。" + " word" * planning.LAZY_PLAN_CHARS, seed=0)


def test_a_later_block_in_another_script_is_refused_before_any_audio(tiny, monkeypatch):
    """A book with a paragraph the model cannot read far into it is refused at the call, as a short text is, not
    after minutes of audio; only the blocks with a letter of another script are planned for that."""
    book = _book(260)
    planned = []
    real_segments = tiny.segments

    def counting(block, normalize=True, max_tokens=None):
        planned.append(block)
        return real_segments(block, normalize, max_tokens)

    monkeypatch.setattr(tiny, "segments", counting)
    with pytest.raises(TextError, match="'我' .* another script"):
        tiny.synthesize_stream(book + "\n\nShe said 我有三个苹果 and left.\n\nThe end.", seed=0)
    assert len(planned) == 1 and "我" in planned[0]  # only the block with the letter, before the first is
    # a letter normalisation makes readable (the micro sign becomes Greek mu), or Latin ones, pass
    planned.clear()
    fine = tiny.synthesize_stream(book + "\n\nTake 5 µg of it at the café, Zoë.", seed=0)
    assert len(planned) == 2
    fine.close()
