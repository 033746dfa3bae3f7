"""Long-form synthesis: normalisation, segmentation, one voice for every segment, streaming across segments."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza import Cadenza

from toy_model import build_toy_model_dir

PARAGRAPHS = (
    "Chapter IV. On 2024-03-15 the committee met at 3:45 pm. It approved a budget of $1,234.56 for 12 new chairs.\n\n"
    "Dr. Smith said the hall holds 250 people; nobody disagreed. The next meeting is on April 2nd.\n\n"
    "希望你以后能够做的比我还好呦。我有3个苹果，今天是2024年3月15日。"
)


@pytest.fixture(scope="module")
def tts(cv2_dir, tmp_path_factory):
    with Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")) as model:
        yield model


def test_segments_are_normalised_and_within_budget(tts, monkeypatch):
    import cadenza.api.cosyvoice2 as api

    monkeypatch.setattr(api, "SEGMENT_TOKENS", 40)
    segments = tts.segments(PARAGRAPHS)
    assert len(segments) >= 4
    tok = tts.engine.frontend.tokenizer
    assert all(len(tok.encode(s)) <= 40 for s in segments)
    joined = " ".join(segments)
    assert not any(c.isdigit() for c in joined)
    assert "three" in joined or "三" in joined
    raw = tts.segments("I have 3 apples.", normalize=False)
    assert raw == ["I have 3 apples."]


def test_every_segment_uses_the_same_voice(tts, monkeypatch):
    import cadenza.api.cosyvoice2 as api

    monkeypatch.setattr(api, "SEGMENT_TOKENS", 40)
    reqs = tts.requests(PARAGRAPHS, prompt_wav=(np.sin(np.arange(32000) / 9).astype(np.float32) * 0.3, 16000),
                        prompt_text="one two three four", seed=11)
    assert len(reqs) >= 4
    assert all(r.voice is reqs[0].voice for r in reqs)
    assert [r.seed for r in reqs] == [11 + k for k in range(len(reqs))]


def test_long_text_synthesis_and_streaming_agree(tts, monkeypatch):
    import cadenza.api.cosyvoice2 as api

    monkeypatch.setattr(api, "SEGMENT_TOKENS", 40)
    calls = []
    audio = tts.synthesize(PARAGRAPHS, seed=5, progress=lambda done, total: calls.append((done, total)))
    n = len(tts.segments(PARAGRAPHS))
    assert calls == [(k + 1, n) for k in range(n)]
    hop = tts.engine.token2wav.hop
    assert len(audio.samples) % hop == 0 and len(audio.samples) > 0
    chunks = list(tts.synthesize_stream(PARAGRAPHS, seed=5))
    # same seeds, same speech tokens: streaming covers exactly the same duration, segment after segment
    assert sum(len(c) for c in chunks) == len(audio.samples)
    assert len(chunks) >= n


def test_normalize_false_keeps_the_text(tts):
    a = tts.request("Room 101", seed=1, normalize=False)
    b = tts.request("Room 101", seed=1)
    assert a.text_ids.tolist() != b.text_ids.tolist()
    assert tts.engine.frontend.tokenizer.decode(a.text_ids[0].tolist()) == "Room 101"


def test_a_segment_stream_cancelled_from_another_thread_frees_everything(tts, monkeypatch):
    """The server cancels from the event loop's thread while a worker reads: segments in flight are freed, the
    ones not yet submitted never are, and the reader ends."""
    import threading

    import cadenza.api.cosyvoice2 as api
    from cadenza.engine.long_form import SegmentStream
    from cadenza.errors import RequestCancelledError

    monkeypatch.setattr(api, "SEGMENT_TOKENS", 40)
    sched = tts.engine.scheduler
    submitted = []

    def submit(request, stream):
        submitted.append(request)
        return sched.submit(request, stream=stream)

    reqs = tts.requests(PARAGRAPHS, seed=3)
    segments = SegmentStream(submit, reqs, window=2)
    assert next(segments).size > 0 and len(submitted) == 2  # two in flight, the rest waiting
    threading.Thread(target=segments.cancel).start()
    try:
        for _ in segments:
            pass
    except RequestCancelledError:
        pass  # a reader blocked in a segment wakes up this way
    assert len(submitted) == 2 < len(reqs)
    import time

    deadline = time.time() + 30
    while sched.load != (0, 0) and time.time() < deadline:
        time.sleep(0.02)
    assert sched.load == (0, 0)


class _FakeHandle:
    """A segment's stream handle: ``chunks`` arrays, recording how many segments were submitted when each was made."""

    def __init__(self, index: int, chunks: int, log: list, submitted: list) -> None:
        self.index, self.chunks, self.log, self.submitted = index, chunks, log, submitted

    def __iter__(self):
        for k in range(self.chunks):
            self.log.append((self.index, k, len(self.submitted)))
            yield np.full(4, self.index, dtype=np.float32)

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("stream", [True, False])
def test_a_streamed_segment_starts_once_the_one_before_has_sent_audio(stream):
    """Streamed, the next segment is submitted when the playing one sends its first chunk (submitted together, the
    second sentence's first chunk delayed the first's: cadenza-tiny, 0.77 s against 0.48 s on one thread), and
    before that chunk is handed to the reader (a reader that plays it first must not delay the next); not streamed,
    the window fills at once."""
    from cadenza.engine.long_form import SegmentStream

    submitted, log = [], []

    def submit(request, stream_flag):
        assert stream_flag is stream
        submitted.append(request)
        return _FakeHandle(request, 3, log, submitted)

    segments = SegmentStream(submit, [0, 1, 2, 3], window=2, stream=stream)
    first = next(segments)
    assert first[0] == 0 and submitted == [0, 1]  # the next one already started, before the reader got audio
    chunks = [first, *segments]
    assert [int(c[0]) for c in chunks] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    made_first = {seg: n for seg, k, n in log if k == 0}
    if stream:
        assert made_first == {0: 1, 1: 2, 2: 3, 3: 4}  # each segment's first chunk came with only those before it
    else:
        assert made_first[0] == 2  # both in flight from the start


def test_a_short_segment_holds_no_later_one_back():
    """A segment that can make at most 2 s of speech ("Yes.") may end before the next one's first chunk could come:
    the next starts with it (the benchmark's short openers stalled 0.04-0.19 s when held back)."""
    from types import SimpleNamespace

    from cadenza.engine.long_form import SHORT_SEGMENT_TOKENS, SegmentStream

    submitted, log = [], []

    def submit(request, stream_flag):
        submitted.append(request.i)
        return _FakeHandle(request.i, 2, log, submitted)

    sizes = [SHORT_SEGMENT_TOKENS, SHORT_SEGMENT_TOKENS + 1, 200, 200]
    requests = [SimpleNamespace(i=i, max_tokens=n) for i, n in enumerate(sizes)]
    chunks = list(SegmentStream(submit, requests, window=2, stream=True))
    assert [int(c[0]) for c in chunks] == [0, 0, 1, 1, 2, 2, 3, 3]
    made_first = {seg: n for seg, k, n in log if k == 0}
    assert made_first == {0: 2, 1: 2, 2: 3, 3: 4}  # only the short one let the next start before its audio


def test_a_refused_next_segment_loses_no_audio_and_fails_the_next_call():
    """The next segment is submitted as the playing one sends its first chunk; if the engine refuses it then, that
    chunk still reaches the reader and the refusal comes with the next call, the segment still pending."""
    from cadenza.engine.long_form import SegmentStream
    from cadenza.errors import EngineBusyError

    submitted, log, refuse = [], [], [True]

    def submit(request, stream_flag):
        if request == 1 and refuse[0]:
            raise EngineBusyError("busy")
        submitted.append(request)
        return _FakeHandle(request, 2, log, submitted)

    segments = SegmentStream(submit, [0, 1], window=2, stream=True)
    assert next(segments)[0] == 0 and submitted == [0]
    with pytest.raises(EngineBusyError):
        next(segments)
    refuse[0] = False
    assert [int(c[0]) for c in segments] == [0, 1, 1]  # nothing lost: segment 0's rest, then segment 1
