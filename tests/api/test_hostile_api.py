"""The hostile-input sweep of the Python API (issue #19): ``Cadenza`` / ``VoxCPM2`` methods other than
``from_pretrained`` (synthesize, streams, prompts, speakers, voice conversion, devices). Each hostile input gives a
specific ``cadenza.errors`` exception (docs/hostile_input.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza.errors import AudioError, InputError, TextError, UnknownSpeakerError
from hostile_entry_points import SR, TEXT, speech_like


# --------------------------------------------------------------------------------------------------------------
# Python API: Cadenza
# --------------------------------------------------------------------------------------------------------------
def _good() -> tuple[np.ndarray, int]:
    return speech_like(1.4), SR


@pytest.mark.parametrize("kwargs, error, message", [
    ({"text": 5}, TextError, "text must be a string, not int"),
    ({"text": b"hello"}, TextError, "text must be a string, not bytes"),
    ({"text": "a\x00b"}, TextError, "text contains a NUL character at character 1"),
    ({"text": "hi \ud800"}, TextError, "text is not valid Unicode: a lone surrogate U+D800 at character 3"),
    ({"text": "hi \ud800", "normalize": False}, TextError, "text is not valid Unicode"),
    ({"text": " " * 1_000_000}, TextError, "text is empty"),
    ({"text": "word " * 200_000 + "\x00"}, TextError, "text contains a NUL character at character 1000000"),
    ({"text": "Hi.", "prompt_wav": "GOOD", "prompt_text": 5}, TextError, "prompt_text must be a string, not int"),
    ({"text": "Hi.", "prompt_wav": "GOOD", "prompt_text": "a\udc80"}, TextError, "prompt_text is not valid Unicode"),
    ({"text": "Hi.", "instruct": "\ud800"}, TextError, "instruct is not valid Unicode"),
    ({"text_ids": ["a", "b"]}, InputError, "text_ids must be integer token ids; item 0 is 'a' (str)"),
    ({"text_ids": [1.5]}, InputError, "text_ids must be integer token ids; item 0 is 1.5 (float)"),
    ({"text_ids": [True]}, InputError, "item 0 is True (bool)"),
    ({"text_ids": "123"}, InputError, "text_ids must be a sequence of integer token ids, not str"),
    ({"text_ids": np.ones((2, 3), np.int64)}, InputError, "got int64 of shape (2, 3)"),
    ({"text_ids": [-1, 5]}, TextError, "text_ids must be ids in [0, "),
    ({"text": "Hi.", "seed": -1}, InputError, "seed must be an integer from 0 to 2**63-1, got -1"),
    ({"text": "Hi.", "seed": 2**64}, InputError, "got 18446744073709551616"),
    ({"text": "Hi.", "seed": "1"}, InputError, "got '1'"),
    ({"text": "Hi.", "seed": 1.5}, InputError, "got 1.5"),
    ({"text": "Hi.", "speed": "fast"}, InputError, "speed must be a finite number (0.5-2.0), got 'fast'"),
    ({"text": "Hi.", "speed": float("nan")}, InputError, "got nan"),
    ({"text": "Hi.", "speed": None}, InputError, "got None"),
    ({"text": "Hi.", "speaker": 5}, InputError, "speaker must be a string (a saved speaker id or voice name), not int"),
    ({"text": "Hi.", "speaker": "x" * 10_000}, UnknownSpeakerError, "speaker is 10000 characters"),
    ({"text": "Hi.", "speaker": ""}, UnknownSpeakerError, "speaker is empty"),
    ({"text": "Hi.", "speaker": "../../etc/passwd"}, UnknownSpeakerError, "unknown speaker '../../etc/passwd'"),
    ({"text": "Hi.", "prompt_wav": 5}, AudioError, "cannot read audio from a int"),
    ({"text": "Hi.", "prompt_wav": "x" * 10_000}, AudioError, "cannot read audio file 'xxx"),
    ({"text": "Hi.", "prompt_wav": b""}, AudioError, "is empty (0 bytes)"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), 0)}, AudioError,
     "sample rate must be an integer from 8000 to 192000 Hz, got 0"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), "24000")}, AudioError, "got '24000'"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), True)}, AudioError, "got True"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), 10**9)}, AudioError, "got 1000000000"),
    ({"text": "Hi.", "prompt_wav": (np.ones((1, 1, SR), np.float32), SR)}, AudioError,
     "prompt audio must be [samples] or [channels, samples], got shape (1, 1, 24000)"),
    ({"text": "Hi.", "prompt_wav": (np.array(["a", "b"]), SR)}, AudioError,
     "prompt audio samples must be numbers (float in [-1, 1] or integer PCM), got dtype <U1"),
    ({"text": "Hi.", "prompt_wav": ([[1.0, 2.0], [3.0]], SR)}, AudioError, "are not an array of numbers"),
    ({"text": "Hi.", "prompt_wav": (np.ones(SR, np.float32), SR, 1)}, AudioError,
     "prompt audio as a tuple is (samples, sample_rate), got 3 items"),
    ({"text": "Hi.", "prompt_wav": (np.full(SR, np.nan, np.float32), SR)}, AudioError, "NaN or infinite samples"),
    ({"text": "Hi.", "prompt_wav": (np.zeros(0, np.float32), SR)}, AudioError, "too short: 0 samples"),
    ({"text": "Hi.", "prompt_wav": (np.ones(1, np.float32), SR)}, AudioError, "too short: 1 sample"),
    ({"text": "Hi.", "prompt_wav": (np.tile(speech_like(1.0, 8000), 600), 8000)}, AudioError, "too long: 600.00 s"),
    # another API's name for an argument: ours, named (was a TypeError naming the inner Cadenza.requests())
    ({"text": "Hi.", "voice": "joe"}, InputError, "takes no argument 'voice' (use speaker= (a saved voice) or"),
    ({"text": "Hi.", "prompt_audio": "me.wav"}, InputError, "takes no argument 'prompt_audio' (use prompt_wav=)"),
    ({"text": "Hi.", "normalize": "no"}, InputError, "normalize must be True or False, not 'no'"),  # was: true
    ({"text": "Hi.", "speaker": "NAMED", "prompt_text": "zzz"}, InputError, "a saved speaker brings its own"),
])
def test_api_synthesize_hostile(tts, kwargs, error, message):
    kwargs = {k: (_good() if isinstance(v, str) and v == "GOOD" else v) for k, v in kwargs.items()}
    if kwargs.get("speaker") == "NAMED":  # the model's own speaker (ignored without the check)
        kwargs["speaker"] = tts.speakers[0]
    with pytest.raises(error) as info:
        tts.synthesize(**kwargs)
    assert message in str(info.value) and len(str(info.value)) < 400, str(info.value)[:400]


def test_api_integer_pcm_prompts_are_scaled(tts):
    """(samples, rate) with int16 / uint8 PCM: scaled to [-1, 1] like a decoded file, not taken as huge floats."""
    wav = speech_like(1.4)
    as_float = tts.voice_from_audio((wav, SR), TEXT)
    as_int16 = tts.voice_from_audio((np.round(wav * 32767).astype(np.int16), SR), TEXT)
    as_uint8 = tts.voice_from_audio((np.round(wav * 127 + 128).astype(np.uint8), SR), TEXT)
    torch.testing.assert_close(as_int16.embedding, as_float.embedding, atol=1e-3, rtol=1e-3)
    assert torch.nn.functional.cosine_similarity(as_uint8.embedding.flatten(),
                                                 as_float.embedding.flatten(), dim=0) > 0.99


def test_api_convert_voice_and_add_speaker_hostile(tts, audio):
    with pytest.raises(InputError, match=r"seed must be an integer from 0 to 2\*\*63-1, got -1"):
        tts.convert_voice(audio["good"], audio["good"], seed=-1)
    with pytest.raises(AudioError, match="sample rate must be an integer"):
        tts.convert_voice((np.ones(SR, np.float32), 0), audio["good"])
    with pytest.raises(AudioError, match=r"source audio is too long: 600.00 s, the limit is 300 s \(convert it in parts\)"):
        tts.convert_voice(audio["ten_min"], audio["good"])
    with pytest.raises(AudioError, match="cannot read audio from a NoneType"):
        tts.convert_voice(None, audio["good"])
    # the target voice is checked before the source audio is read: not_audio would fail otherwise
    with pytest.raises(UnknownSpeakerError, match="unknown speaker 'nobody'"):
        tts.convert_voice(audio["not_audio"], speaker="nobody")
    with pytest.raises(InputError, match="either prompt_wav or speaker as the target voice"):
        tts.convert_voice(audio["not_audio"], audio["good"], speaker="joe")
    # the id is checked before the audio is decoded: not_audio would fail otherwise
    for speaker_id, error, message in (("x" * 10_000, InputError, "speaker id is 10000 characters; at most 64"),
                                       ("../../x", InputError, "invalid speaker id '../../x'"),
                                       ("", InputError, "invalid speaker id ''"),
                                       ("a\x00", InputError, "invalid speaker id 'a\\x00'"),
                                       (5, InputError, "speaker id must be a string, not int")):
        with pytest.raises(error) as info:
            tts.add_speaker(speaker_id, audio["not_audio"], TEXT, save=False)
        assert message in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(TextError, match="prompt_text is not valid Unicode"):
        tts.add_speaker("ok", audio["good"], "\ud800", save=False)
    with pytest.raises(AudioError, match="cannot decode"):
        tts.add_speaker("ok", audio["not_audio"], TEXT, save=False)
    assert "ok" not in tts.speakers


def test_api_synthesize_stream_hostile(tts):
    with pytest.raises(TextError, match="text must be a string or an iterable of strings, not int"):
        tts.synthesize_stream(5)
    with pytest.raises(TextError, match="text must be a string or an iterable of strings, not bytes"):
        tts.synthesize_stream(b"hello")
    with pytest.raises(TextError, match="text is not valid Unicode"):
        tts.synthesize_stream("\ud800 hi")
    for pieces, message in ((["hi \ud800"], "text piece 0 is not valid Unicode"),
                            (["hello ", "a\x00"], "text piece 1 contains a NUL character at character 1"),
                            ([b"hi"], "text pieces must be strings, not bytes (piece 0)"),
                            ([], "the text stream ended with nothing to speak"),
                            (["  ", "\n", "..."], "the text stream ended with nothing to speak")):
        with pytest.raises(TextError, match=re.escape(message)):
            list(tts.synthesize_stream(iter(pieces), seed=0))


def test_voxcpm2_entry_points_check_their_arguments():
    """``VoxCPM2`` refuses hostile arguments before its engine sees them (a stand-in engine records any call)."""
    from cadenza.api.voxcpm2 import VoxCPM2

    class Engine:
        calls = 0
        sample_rate = 48000  # the output watermark is set up for it

        def build(self, *a, **k):
            Engine.calls += 1
            raise AssertionError("the engine must not be reached")

        synthesize = stream = build

    vx = VoxCPM2(Engine(), Path("."))
    for call, error, message in (
        (lambda: vx.synthesize(5), TextError, "text must be a string, not int"),
        (lambda: vx.synthesize("hi\x00"), TextError, "text contains a NUL character at character 2"),
        (lambda: vx.synthesize("hi \ud800"), TextError, "text is not valid Unicode"),
        (lambda: vx.synthesize("hi", prompt_wav="x.wav", prompt_text="\udcff"), TextError,
         "prompt_text is not valid Unicode"),
        (lambda: vx.synthesize("hi", seed=-3), InputError, "seed must be an integer from 0 to 2**63-1, got -3"),
        (lambda: vx.synthesize("hi", seed=1.5), InputError, "got 1.5"),
        (lambda: vx.synthesize_stream(b"hi"), TextError, "a string or an iterable of strings, not bytes"),
        (lambda: vx.design(5, "hi"), TextError, "description must be a string, not int"),
        (lambda: vx.design("warm", "\x00"), TextError, "text contains a NUL character"),
        (lambda: vx.design("()", "hi"), InputError, "the voice description is empty"),
    ):
        with pytest.raises(error) as info:
            call()
        assert message in str(info.value)
    assert Engine.calls == 0


def test_api_device_checks():
    from cadenza.api import check_device

    assert check_device("cpu") == "cpu"
    for device, message in (("bogus", "is not a torch device"), ("vulkan", "device type 'vulkan' is not supported"),
                            (None, "is not a torch device")):
        with pytest.raises(InputError, match=message):
            check_device(device)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available on this machine"):
            check_device("cuda:0")


