"""Live voice conversion (``Cadenza.live_conversion``, ``api/live_conversion.py``): the source pushed in pieces as it is
recorded, the converted audio read as it is made. The windowed tokenizer's ids do not depend on how the source was
cut; the audio is the engine's for those ids, as long as the source; bad pieces, a source past its bound, too short
or silent, and closing early are handled."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import cadenza
from cadenza.api.live_conversion import (
    LEFT_CONTEXT_TOKENS,
    LOOKAHEAD_TOKENS,
    MAX_WINDOW_TOKENS,
    STEP_TOKENS,
    TOKEN_SAMPLES,
    LiveTokenizer,
)
from cadenza.audio.resample import resample
from cadenza.engine.request import SynthesisRequest
from cadenza.errors import AudioError, InputError, UnknownSpeakerError


@pytest.fixture(scope="module")
def tiny():
    with cadenza.load() as model:
        yield model


@pytest.fixture(scope="module")
def source16k(tiny) -> np.ndarray:
    """A spoken sentence (the built-in voice at 1.2x), at the tokenizer's 16 kHz."""
    line = tiny.synthesize("Please close the window before you leave the house tonight.", speed=1.2, seed=3)
    return resample(torch.from_numpy(line.samples), line.sample_rate, 16000).numpy()


def _pieces(samples: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    cuts = np.cumsum(sizes)
    return [p for p in np.split(samples, cuts[cuts < samples.size])]


def _convert(tiny, samples: np.ndarray, sr: int, sizes: list[int], **kwargs) -> np.ndarray:
    with tiny.live_conversion(sr, **kwargs) as live:
        live.feed_from(_pieces(samples, sizes))
        return np.concatenate(list(live))


def test_windowed_tokens_do_not_depend_on_the_pieces():
    """Token k of a signal whose 40 ms frame k holds the value k/1000 reads as k: every cut of the source gives every
    token once, in order; each window reaches ``LEFT_CONTEXT_TOKENS`` back and ``LOOKAHEAD_TOKENS`` ahead of what it
    commits (less only at the ends) and never past 30 s."""
    n = 237
    signal = torch.arange(n).repeat_interleave(TOKEN_SAMPLES).float() / 1000.0
    signal = torch.cat([signal, torch.full((300,), 0.5)])  # a partial token at the end: not a token
    rng = np.random.default_rng(0)
    for sizes in ([len(signal)], [1] * 700 + [len(signal)], list(rng.integers(0, 5000, 400)), [640] * 300):
        windows = []

        def read(window, windows=windows):
            windows.append(window.clone())
            frames = window[: window.numel() // TOKEN_SAMPLES * TOKEN_SAMPLES].reshape(-1, TOKEN_SAMPLES)
            return (frames.mean(dim=1) * 1000).round().long().reshape(1, -1)

        tokens = LiveTokenizer(read)
        ids, cut = [], 0
        for size in sizes:
            ids += tokens.push(signal[cut:cut + int(size)])
            cut += int(size)
        ids += tokens.finish()
        assert ids == list(range(n))
        firsts = [int(round(float(w[0]) * 1000)) for w in windows]
        lasts = [int(round(float(w[w.numel() // TOKEN_SAMPLES * TOKEN_SAMPLES - 1]) * 1000)) for w in windows]
        assert all(w.numel() <= MAX_WINDOW_TOKENS * TOKEN_SAMPLES for w in windows)
        commit = 0
        for first, last in zip(firsts, lasts):
            assert first == max(0, commit - LEFT_CONTEXT_TOKENS)
            end = min(commit + STEP_TOKENS, n)
            assert last == min(end + LOOKAHEAD_TOKENS, n) - 1
            commit = end
        assert commit == n


def test_live_audio_is_the_same_for_any_pieces_and_as_long_as_the_source(tiny, source16k):
    """Pushed in 20 ms pieces, in uneven ones from another thread at real-time pace, or whole: the same samples; they
    are the engine's own stream of the windowed ids (fed in one go), one hop of audio per 40 ms of source."""
    whole = _convert(tiny, source16k, 16000, [source16k.size], seed=2)
    small = _convert(tiny, source16k, 16000, [320] * (source16k.size // 320 + 1), seed=2)
    np.testing.assert_array_equal(small, whole)
    rng = np.random.default_rng(1)
    uneven = _convert(tiny, source16k, 16000, list(rng.integers(1, 9000, 200)), seed=2)
    np.testing.assert_array_equal(uneven, whole)
    tokens = LiveTokenizer(tiny.engine.frontend.speech_tokens)
    ids = tokens.push(torch.from_numpy(source16k)) + tokens.finish()
    assert len(ids) == source16k.size // TOKEN_SAMPLES
    assert whole.size == len(ids) * tiny.engine.token2wav.hop
    voice = tiny._voice(None, None, None, None, None)[0]
    request = SynthesisRequest(mode="vc", voice=voice, source_tokens=torch.zeros(1, 0, dtype=torch.long),
                               live_source=True, seed=2, max_tokens=len(ids))
    handle = tiny.engine.scheduler.submit(request, stream=True)
    handle.feed_source(ids)
    handle.end_source()
    np.testing.assert_array_equal(tiny.mark.whole(np.concatenate(list(handle))), whole)


def test_any_rate_and_format_of_source(tiny, source16k):
    """A 44.1 kHz stereo source in int16 frames is converted too (resampled as it streams): as long as the source,
    and its ids within a token or two of the 16 kHz reading's."""
    at44 = resample(torch.from_numpy(source16k), 16000, 44100).numpy()
    stereo = (np.stack([at44, at44], axis=1) * 32767).astype(np.int16)
    out = _convert(tiny, stereo, 44100, [4410] * (len(stereo) // 4410 + 1), seed=2)
    tokens = len(stereo) * 16000 // 44100 // TOKEN_SAMPLES
    assert abs(out.size - tokens * tiny.engine.token2wav.hop) <= tiny.engine.token2wav.hop
    assert np.isfinite(out).all() and np.abs(out).max() > 0.05


def test_bad_arguments_and_sources(tiny, source16k):
    with pytest.raises(InputError, match="sample_rate must be an integer from 8000"):
        tiny.live_conversion(7999)
    with pytest.raises(InputError, match="sample_rate"):
        tiny.live_conversion(True)
    with pytest.raises(InputError, match="not both"):
        tiny.live_conversion(16000, prompt_wav=(source16k, 16000), speaker="joe")
    with pytest.raises(UnknownSpeakerError):
        tiny.live_conversion(16000, speaker="nobody-saved-this")
    with pytest.raises(InputError, match="max_seconds"):
        tiny.live_conversion(16000, max_seconds=0)
    with pytest.raises(InputError, match="seed"):
        tiny.live_conversion(16000, seed=-1)

    def refused(pieces, match, end=True, **kwargs):
        """The producer's call raises ``match``, and so does the iteration (the same error)."""
        with tiny.live_conversion(16000, seed=0, **kwargs) as live:
            with pytest.raises((AudioError, InputError), match=match):
                for piece in pieces:
                    live.push(piece)
                if end:
                    live.end()
            with pytest.raises((AudioError, InputError), match=match):
                list(live)

    refused([source16k[:8000], "not audio"], "source piece 1 must be a numpy array")
    refused([np.array([0.1, np.nan], np.float32)], "NaN or infinite")
    refused([np.ones((4, 4, 4), np.float32)], "must be")
    refused([np.ones(100, np.int32)], "float or int16")
    refused([source16k, source16k], "too long: past 2 s", max_seconds=2)
    refused([source16k[:4000]], "too short: 0.25 s")
    refused([np.zeros(32000, np.float32)], "silent")
    with tiny.live_conversion(16000) as live:
        live.push(source16k)
        live.end()
        with pytest.raises(InputError, match="has ended"):
            live.push(source16k[:100])
        assert len(list(live)) > 0


def test_closing_early_frees_the_engine(tiny, source16k):
    """Closed after its first chunk, while its producer still pushes in real time: the engine's slot comes back."""
    live = tiny.live_conversion(16000, seed=0)
    stop = threading.Event()

    def produce():
        for piece in _pieces(source16k, [1600] * 200):
            if stop.is_set():
                return
            try:
                live.push(piece)
            except Exception:  # noqa: BLE001 - pushing into a closed conversion may fail; it must not hang
                return
            time.sleep(0.1)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    chunks = iter(live)
    assert next(chunks).size > 0
    live.close()
    stop.set()
    thread.join(timeout=10)
    deadline = time.time() + 30
    while tiny.engine.scheduler.load != (0, 0) and time.time() < deadline:
        time.sleep(0.02)
    assert tiny.engine.scheduler.load == (0, 0)


def test_a_conversion_dropped_without_closing_frees_the_engine(tiny, source16k):
    """A live conversion let go of mid-source (no ``close``, no ``end``) gives its engine slot back once it is
    collected; one still being iterated is kept alive by its iteration."""
    import gc

    live = tiny.live_conversion(16000, seed=0)
    live.push(source16k[:32000])
    assert tiny.engine.scheduler.load[0] + tiny.engine.scheduler.load[1] == 1
    del live
    gc.collect()
    deadline = time.time() + 30
    while tiny.engine.scheduler.load != (0, 0) and time.time() < deadline:
        time.sleep(0.02)
    assert tiny.engine.scheduler.load == (0, 0)
    live = tiny.live_conversion(16000, seed=0)
    live.feed_from([source16k])
    chunks = iter(live)
    del live
    gc.collect()
    assert sum(c.size for c in chunks) == source16k.size // TOKEN_SAMPLES * tiny.engine.token2wav.hop
