"""The stream schedule's hops: the reference's first hop on the flow's chunk grid, ours one chunk for any prompt."""

from __future__ import annotations

import pytest

from cadenza.engine.stream_schedule import StreamSchedule, TokenChunker


def hops(schedule: StreamSchedule, prompt_tokens: int, n: int = 8) -> list[int]:
    chunker = TokenChunker(schedule, prompt_tokens, lookahead=3)
    out = []
    for _ in range(n):
        out.append(chunker.hop)
        chunker.advance()
    return out


@pytest.mark.parametrize("prompt_tokens", [0, 1, 12, 24, 25, 87, 100, 113])
def test_first_hop_is_one_chunk_then_back_on_the_grid(prompt_tokens):
    got = hops(StreamSchedule(), prompt_tokens)
    assert got[0] == 25  # the first audio after 25 + 3 tokens, whatever the prompt's length
    ends = [prompt_tokens + sum(got[: k + 1]) for k in range(len(got))]
    assert all(end % 25 == 0 for end in ends[1:]), ends  # every later chunk ends on an attention-chunk boundary
    assert 26 <= got[1] <= 50 if prompt_tokens % 25 else got[1] == 50
    assert got[2:] == [100] * 6
    # The second chunk never asks for more than the reference's (its first hop already holds the pad).
    assert got[0] + got[1] <= hops(StreamSchedule.reference(), prompt_tokens)[0] + 50


@pytest.mark.parametrize("prompt_tokens", [0, 12, 87, 100])
def test_reference_first_hop_holds_the_pad(prompt_tokens):
    pad = -prompt_tokens % 25
    assert hops(StreamSchedule.reference(), prompt_tokens) == [25 + pad, 50, 100, 100, 100, 100, 100, 100]


def test_the_reference_hops_are_kept_whatever_the_cap():
    assert hops(StreamSchedule(token_max_hop_len=60, first_hop_on_grid=True), 87, 4) == [38, 50, 60, 60]


def test_a_hop_cap_of_one_chunk_still_returns_to_the_grid():
    got = hops(StreamSchedule(token_max_hop_len=25), 87, 4)
    assert got == [25, 13, 25, 25]


@pytest.mark.parametrize("prompt_tokens", [0, 87, 100, 113])
@pytest.mark.parametrize("first", [1, 10, 15, 40])
def test_a_shorter_first_hop_then_chunks_on_the_grid_that_grow(first, prompt_tokens):
    got = hops(StreamSchedule(first_hop_len=first), prompt_tokens, 10)
    assert got[0] == first
    ends = [prompt_tokens + sum(got[: k + 1]) for k in range(len(got))]
    assert all(end % 25 == 0 for end in ends[1:]), ends
    base = first
    for hop in got[1:]:  # each at least half the doubled target, and at most one chunk past it
        base = min(100, 2 * base)
        assert max(1, base // 2) <= hop < base + 25, got
    assert got[-1] == 100


def test_first_hop_len_is_checked():
    for bad in (0, 101):
        with pytest.raises(ValueError, match="first_hop_len must be from 1 to token_max_hop_len"):
            StreamSchedule(first_hop_len=bad)
    with pytest.raises(ValueError, match="only with first_hop_on_grid False"):
        StreamSchedule(first_hop_len=10, first_hop_on_grid=True)
