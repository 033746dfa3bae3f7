"""Red-team findings in the Python API (the built-in model): arguments test_hostile_api.py did not try, which gave a
foreign exception, the wrong cadenza error, or a misleading message. Each now raises the specific cadenza error."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza.api.arguments import MAX_PROMPT_TEXT_CHARS
from cadenza.errors import AudioError, InputError, TextError
from cadenza.voices import VoiceStore
from hostile_entry_points import SR, TEXT, speech_like


def test_numpy_integer_seeds_are_seeds(tts):
    """check_seed takes numpy integers, but the request's RNG refused them: "seed must be a non-negative integer,
    not '3'" (a message that contradicts itself)."""
    requests = tts.requests("Hello there. How are you?", seed=np.int64(3))
    assert [r.seed for r in requests] == list(range(3, 3 + len(requests)))
    assert tts.requests("Hello there.", seed=np.uint32(7))[0].seed == 7
    assert tts.requests("Hello there.", seed=3)[0].seed == 3


def test_a_speed_past_floats_range_is_an_input_error(tts):
    """``math.isfinite(10**400)`` raised OverflowError from inside the check."""
    with pytest.raises(InputError, match=r"speed must be a finite number \(0\.5-2\.0\), got 1000"):
        tts.requests("Hello there.", speed=10**400)
    with pytest.raises(InputError, match="speed must be a finite number"):
        tts.requests("Hello there.", speed=-(10**400))


@pytest.mark.parametrize("shape", [(SR, 0), (0, SR)])
def test_prompt_arrays_without_channels_or_samples_say_so(tts, tmp_path, shape):
    """A [N, 0] or [0, N] array was averaged over its empty axis into NaN: "prompt audio contains NaN or infinite
    samples", about audio that holds no sample at all."""
    with pytest.raises(AudioError, match=r"prompt audio has no samples or no channels: shape \(\d+, \d+\)"):
        tts.voice_from_audio((np.zeros(shape, np.float32), SR), TEXT)
    store = VoiceStore(tmp_path)
    with pytest.raises(AudioError, match="no samples or no channels"):
        store.add("empty", (np.zeros(shape, np.float32), SR), TEXT, "I agree to the use of my voice, signed.")
    assert "empty" not in store
    store.close()


def test_prompt_samples_louder_than_any_scale_are_an_audio_error(tts):
    """Finite samples of 1e30 overflowed the speaker encoder's features: CheckpointError ("the speaker encoder gave
    a non-finite embedding"), which blames the model's files (a server answers that with 503 and turns /health
    red) for the caller's audio."""
    loud = speech_like(1.4) * np.float32(1e30)
    with pytest.raises(AudioError, match=r"prompt audio peaks at [0-9.]+e\+29: samples are floats on a \[-1, 1\] scale"):
        tts.voice_from_audio((loud, SR), TEXT)
    with pytest.raises(AudioError, match="peaks at"):
        tts.synthesize("Hi.", prompt_wav=(loud, SR), prompt_text=TEXT, seed=1)
    # 16-bit PCM handed over as floats (a common slip) still reads, as it did before.
    assert tts.voice_from_audio((speech_like(1.4) * np.float32(32767), SR), TEXT) is not None


def test_a_progress_that_is_not_callable_is_refused_before_the_work(tts, monkeypatch):
    """``progress=5`` raised "TypeError: 'int' object is not callable" after the first segment was synthesised."""
    def no_work(*args, **kwargs):
        raise AssertionError("synthesis must not start")

    monkeypatch.setattr(tts, "requests", no_work)
    with pytest.raises(InputError, match=r"progress must be a callable progress\(done, total\), not int"):
        tts.synthesize("Hello there.", progress=5)


def test_an_oversized_prompt_transcript_or_instruction_is_refused_before_the_work(tts, monkeypatch):
    """The API had no length limit on ``prompt_text`` (the server's voice store takes 2,000 characters): a
    100,000-word transcript ran the LM for minutes (past a 5-minute timeout with 20,000 words). Now a ``TextError``
    before any audio is decoded; ``instruct`` is bounded like the server's ``instructions`` (4,096)."""
    def no_work(*args, **kwargs):
        raise AssertionError("the prompt must not be read")

    monkeypatch.setattr(tts, "voice_from_audio", no_work)
    prompt = (speech_like(1.4), SR)
    with pytest.raises(TextError, match="prompt_text is 2001 characters; at most 2000"):
        tts.synthesize("Hi.", prompt_wav=prompt, prompt_text="a" * 2001)
    with pytest.raises(TextError, match="prompt_text is 100000 characters; at most 2000"):
        tts.synthesize_stream("Hi.", prompt_wav=prompt, prompt_text="word " * 20000)
    with pytest.raises(TextError, match="prompt_text is 2001 characters"):
        tts.add_speaker("long", prompt, "a" * 2001, save=False)
    with pytest.raises(TextError, match="instruct is 4097 characters; at most 4096"):
        tts.synthesize("Hi.", instruct="a" * 4097)
    monkeypatch.undo()
    # At the limit the transcript is taken (the voice is made from it).
    assert tts.voice_from_audio(prompt, ("a " * 1000)[:MAX_PROMPT_TEXT_CHARS]) is not None
