"""``synthesize_iter``: ``synthesize`` a segment at a time (what ``cadenza synth -o`` writes as it comes), for both
families: the same samples, in pieces, with progress, timestamps and early close."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import cadenza
from cadenza.errors import InputError, TextError

TEXT = "The first sentence is short. A second one follows it. And a third one ends it."


def test_the_pieces_are_the_segments_of_synthesize(builtin_tts):
    calls: list[tuple[int, int]] = []
    pieces = list(builtin_tts.synthesize_iter(TEXT, seed=4, progress=lambda done, total: calls.append((done, total))))
    assert len(pieces) == 3 and calls == [(1, 3), (2, 3), (3, 3)]  # the built-in reads a sentence per segment
    assert all(p.dtype == np.float32 and p.size > 12000 for p in pieces)
    np.testing.assert_array_equal(np.concatenate(pieces), builtin_tts.synthesize(TEXT, seed=4).samples)

    ssml = '<speak>Open the door.<break time="300ms"/>Close the window.</speak>'
    pieces = list(builtin_tts.synthesize_iter(ssml, seed=2))
    assert any(p.size == 7200 and not p.any() for p in pieces)  # the break: 0.3 s of exact zeros, a piece of its own
    np.testing.assert_array_equal(np.concatenate(pieces), builtin_tts.synthesize(ssml, seed=2).samples)

    timed = list(builtin_tts.synthesize_iter(TEXT, seed=4, timestamps=True))
    words = [w for chunk in timed for w in chunk.words]
    assert [w.word for w in words] == TEXT.split()
    ends = [w.end for w in words]
    assert ends == sorted(ends) and ends[-1] <= sum(c.audio.size for c in timed) / builtin_tts.sample_rate + 1e-6

    with pytest.raises(InputError, match="progress must be a callable"):
        builtin_tts.synthesize_iter(TEXT, progress="yes")


def test_closing_early_leaves_the_engine_free(builtin_tts):
    pieces = builtin_tts.synthesize_iter(" ".join([TEXT] * 4), seed=1)
    assert next(pieces).size > 0
    pieces.close()
    deadline = time.monotonic() + 30
    while builtin_tts.load != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert builtin_tts.load == (0, 0)


def test_voxcpm2_gives_its_text_whole_as_one_piece(vx2_model_dir):
    with cadenza.load(vx2_model_dir) as vx2:
        calls: list[tuple[int, int]] = []
        pieces = list(vx2.synthesize_iter("Hello the world.", seed=3, progress=lambda d, t: calls.append((d, t))))
        assert len(pieces) == 1 and calls == [(1, 1)]
        np.testing.assert_array_equal(pieces[0], vx2.synthesize("Hello the world.", seed=3).samples)


def test_voxcpm2_speaks_a_text_longer_than_one_segment_a_segment_at_a_time(vx2_model_dir):
    """Read whole, a long text ran out of the model's positions (the fixture's 512 here, the release's 8,192) and was
    refused; past what one pass holds (a quarter of the positions, at least ``SEGMENT_TOKENS``) it is spoken in as
    few segments as fit, segment k with seed + k, in the API, its streams and the CLI alike."""
    text = " ".join(["The rain stopped before noon and we walked to the river."] * 12)
    with cadenza.load(vx2_model_dir) as vx2:
        segments = vx2.segments(text, max_tokens=vx2._whole_tokens)
        assert len(segments) == 2 and vx2._whole_tokens == 300  # the fixture holds 512 positions
        assert len(vx2.segments(" ".join(text.split(". ")[:3]), max_tokens=vx2._whole_tokens)) == 1  # read whole
        with pytest.raises(TextError, match="split the text"):
            vx2.request(text)  # what synthesize did with it before
        calls: list[tuple[int, int]] = []
        pieces = list(vx2.synthesize_iter(text, seed=3, progress=lambda d, t: calls.append((d, t))))
        assert len(pieces) == 2 and calls == [(1, 2), (2, 2)]
        for k, (piece, segment) in enumerate(zip(pieces, segments)):
            alone = vx2.synthesize(segment, seed=3 + k, normalize=False).samples
            assert len(piece) == len(alone) and np.isfinite(piece).all()
        whole = vx2.synthesize(text, seed=3).samples
        streamed = np.concatenate(list(vx2.synthesize_stream(text, seed=3)))
        assert len(whole) == len(streamed) == sum(len(p) for p in pieces)


_LEAVE_EARLY = """
import sys, cadenza
tts = cadenza.load()
make = tts.synthesize_stream if sys.argv[1] == "stream" else tts.synthesize_iter
chunks = make("Hello there. This is a second sentence. And a third one here.")
next(chunks)
if sys.argv[2] == "close":
    chunks.close()
print("left", flush=True)
"""


@pytest.mark.parametrize("how", ["stream close", "iter close", "iter abandon"])
def test_a_script_that_leaves_early_and_exits_ends_cleanly(how):
    """No ``tts.close()``: the engine's workers, still inside torch for the request, are stopped at exit. Killed
    there at interpreter shutdown they aborted the process ("terminate called without an active exception", 134)."""
    proc = subprocess.run([sys.executable, "-c", _LEAVE_EARLY, *how.split()], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "left", (proc.returncode, proc.stderr[-2000:])
    assert "terminate called" not in proc.stderr
