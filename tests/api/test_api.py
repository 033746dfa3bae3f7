"""End to end through the public API on the reduced checkpoint + a toy frontend (see toy_model.py).

Random weights make noise, so these tests assert what must hold for any weights: lengths, rates, ranges,
determinism under a seed, mode resolution, saved speakers, and errors.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import cadenza
import cadenza.builtin
from cadenza import AudioError, Cadenza, CheckpointError, InputError, TextError, UnknownSpeakerError

from toy_model import build_toy_model_dir

AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or Path(__file__).resolve().parents[2] / "../shared/audio")
TEXT = "Hello there, this is a test."
SR_PROMPT = 16000


def _tone(seconds: float, sr: int = SR_PROMPT, freq: float = 220.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    x = (0.3 * np.sin(2 * np.pi * freq * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


def _wav_bytes(x: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tts(cv2_dir, tmp_path_factory) -> Cadenza:
    return Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model"))


@pytest.fixture(scope="module")
def prompt_wav() -> tuple[np.ndarray, int]:
    path = AUDIO_DIR / "en_stereo_44k.wav"
    if path.is_file():
        data, sr = sf.read(path, dtype="float32")
        return data[: 3 * sr], sr  # 3 s keeps the test fast
    return _tone(3.0), SR_PROMPT


def _check_audio(tts: Cadenza, samples: np.ndarray, n_text: int) -> None:
    hop = tts.engine.token2wav.hop  # samples per speech token (960)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert len(samples) % hop == 0
    n_tokens = len(samples) // hop
    cfg = tts.engine.config.lm
    assert cfg.min_token_text_ratio * n_text <= n_tokens <= cfg.max_token_text_ratio * n_text
    assert np.isfinite(samples).all() and np.abs(samples).max() <= tts.engine.config.hift.audio_limit + 1e-6


def test_zero_shot_is_deterministic_per_seed(tts, prompt_wav):
    n_text = len(tts.engine.frontend.tokenizer.encode(TEXT))
    a = tts.synthesize(TEXT, prompt_wav=prompt_wav, prompt_text="Just by listening a few minutes a day.", seed=7)
    b = tts.synthesize(TEXT, prompt_wav=prompt_wav, prompt_text="Just by listening a few minutes a day.", seed=7)
    c = tts.synthesize(TEXT, prompt_wav=prompt_wav, prompt_text="Just by listening a few minutes a day.", seed=8)
    assert a.sample_rate == 24000
    _check_audio(tts, a.samples, n_text)
    np.testing.assert_array_equal(a.samples, b.samples)
    assert len(a.samples) != len(c.samples) or not np.array_equal(a.samples, c.samples)


def test_modes_resolve_to_the_reference_layouts(tts, prompt_wav):
    zs = tts.request(TEXT, prompt_wav=prompt_wav, prompt_text="Just by listening.", seed=1)
    assert zs.mode == "zero_shot" and zs.lm_prompt_speech.shape[1] == zs.voice.flow_prompt_speech.shape[1] > 0
    assert zs.lm_prompt_text.shape[1] > 0
    # prompt mel and tokens are trimmed to a common length (2 mel frames per token)
    assert zs.voice.prompt_mel.shape[1] == 2 * zs.voice.flow_prompt_speech.shape[1]
    xl = tts.request(TEXT, prompt_wav=prompt_wav, seed=1)
    assert xl.mode == "cross_lingual" and xl.lm_prompt_text.shape[1] == 0 and xl.lm_prompt_speech.shape[1] == 0
    ref = tts.request(TEXT, reference_wav=prompt_wav, seed=1)  # VoxCPM 2's name for a voice without transcript
    assert ref.mode == "cross_lingual" and torch.equal(ref.voice.embedding, xl.voice.embedding)
    with pytest.raises(InputError, match="not both"):
        tts.request(TEXT, reference_wav=prompt_wav, prompt_wav=prompt_wav)
    with pytest.raises(InputError, match="without its transcript"):
        tts.request(TEXT, reference_wav=prompt_wav, prompt_text="Just by listening.")
    ins = tts.request(TEXT, prompt_wav=prompt_wav, instruct="Speak slowly.", seed=1)
    eop = tts.engine.frontend.tokenizer.token_id("<|endofprompt|>")
    assert ins.mode == "instruct2" and ins.lm_prompt_text[0, -1].item() == eop and ins.lm_prompt_speech.shape[1] == 0


def test_streaming_yields_chunks_that_add_up(tts, prompt_wav):
    kwargs = dict(prompt_wav=prompt_wav, seed=3)
    chunks = list(tts.synthesize_stream(TEXT * 3, **kwargs))
    full = tts.synthesize(TEXT * 3, **kwargs).samples
    assert len(chunks) >= 2 and all(c.dtype == np.float32 for c in chunks)
    # Same seed, same speech tokens: the streamed audio has exactly the non-streamed length.
    assert sum(len(c) for c in chunks) == len(full)


def test_bistream_text_from_an_iterator(tts, prompt_wav):
    pieces = ["Hello ", "there, ", "this ", "text ", "arrives ", "piece ", "by ", "piece ", "from ", "an ", "LLM."] * 3
    chunks = list(tts.synthesize_stream(iter(pieces), prompt_wav=prompt_wav, prompt_text="Just by listening.", seed=4))
    assert len(chunks) >= 2 and all(c.dtype == np.float32 and np.isfinite(c).all() for c in chunks)

    def broken():
        yield "Hello there"
        raise ValueError("upstream failed")

    with pytest.raises(ValueError, match="upstream failed"):
        list(tts.synthesize_stream(broken(), prompt_wav=prompt_wav, seed=4))


def test_saved_speaker_round_trip(tts, prompt_wav, tmp_path):
    tts.add_speaker("alice", prompt_wav, "Just by listening a few minutes a day.")
    assert "alice" in tts.speakers
    reloaded = Cadenza.from_pretrained(tts.directory)
    assert "alice" in reloaded.speakers
    a = tts.synthesize(TEXT, speaker="alice", seed=5).samples
    b = reloaded.synthesize(TEXT, speaker="alice", seed=5).samples
    np.testing.assert_array_equal(a, b)
    with pytest.raises(UnknownSpeakerError, match="unknown speaker 'bob'"):
        tts.synthesize(TEXT, speaker="bob")
    with pytest.raises(InputError, match="invalid speaker id"):
        tts.add_speaker("../../etc/passwd", prompt_wav, "x y z")


def test_voice_conversion_keeps_the_source_length(tts, prompt_wav):
    source = _tone(2.0)
    out = tts.convert_voice((source, SR_PROMPT), prompt_wav, seed=1)
    n_tokens = tts.engine.frontend.speech_tokens(torch.from_numpy(source)).shape[1]
    assert len(out.samples) == n_tokens * tts.engine.token2wav.hop
    assert tts.default_speaker is None  # a release folder names no default voice: a target must be given
    with pytest.raises(InputError, match="no default voice"):
        tts.convert_voice((source, SR_PROMPT))
    # a transcript of the source places phoneme tokens; this model's tokens are not phonemes
    with pytest.raises(InputError, match="speech tokens are phonemes"):
        tts.convert_voice((source, SR_PROMPT), prompt_wav, source_text="a tone")


@pytest.mark.parametrize("sr", [8000, 11025, 22050, 44100, 48000])
def test_prompt_audio_at_any_rate_and_stereo(tts, sr):
    voice = tts.voice_from_audio(_wav_bytes(_tone(1.5, sr, channels=2), sr), "one two three")
    assert voice.prompt_mel.shape[1] == 2 * voice.flow_prompt_speech.shape[1] > 0


@pytest.mark.parametrize(
    ("text", "match"),
    [("", "text is empty"), ("   \n\t", "text is empty"), ("?!... ,,;", "nothing to speak"), ("—…", "nothing to speak")],
)
def test_unspeakable_text(tts, text, match):
    with pytest.raises(TextError, match=match):
        tts.synthesize(text, seed=0)


@pytest.mark.parametrize(
    ("audio", "match"),
    [
        (_wav_bytes(np.zeros(SR_PROMPT * 2, np.float32), SR_PROMPT), "silent"),
        (_wav_bytes(_tone(0.3), SR_PROMPT), "too short"),
        (_wav_bytes(_tone(31.0), SR_PROMPT), "too long"),
        (b"RIFF\x00\x00not really a wav file at all", "cannot decode"),
        ("/nonexistent/prompt.wav", "not found"),
    ],
)
def test_bad_prompt_audio(tts, audio, match):
    with pytest.raises(AudioError, match=match):
        tts.synthesize(TEXT, prompt_wav=audio, prompt_text="one two three", seed=0)


def test_argument_errors(tts, prompt_wav):
    with pytest.raises(TextError, match="prompt text is empty"):
        tts.synthesize(TEXT, prompt_wav=prompt_wav, prompt_text="  ")
    with pytest.raises(InputError, match="prompt_text needs prompt_wav"):
        tts.synthesize(TEXT, prompt_text="hello")
    with pytest.raises(InputError, match="exactly one of text or text_ids"):
        tts.synthesize()
    with pytest.raises(InputError, match="speed"):
        tts.synthesize(TEXT, speed=5.0)
    with pytest.raises(ValueError, match="seed"):
        tts.synthesize(TEXT, seed=-1)
    with pytest.raises(TextError, match=r"ids in \[0, "):
        tts.synthesize(text_ids=[1, 2, 10**6])


def test_text_beyond_the_maximum_length(tts):
    with pytest.raises(TextError, match="at most"):
        tts.synthesize(text_ids=[5] * 5000)
    # Long enough that even the minimum speech length overflows the flow's fixed noise (300 s of mel).
    noise_tokens = tts.engine.config.flow.cfm.noise_frames // tts.engine.config.token_mel_ratio
    n = noise_tokens // int(tts.engine.config.lm.min_token_text_ratio) + 1
    if n <= 1000:
        with pytest.raises(TextError, match="too long for one request"):
            tts.synthesize(text_ids=[5] * n)


def test_fixture_folder_takes_token_ids(cv2_dir):
    tts = Cadenza.from_pretrained(cv2_dir)
    audio = tts.synthesize(text_ids=[5, 17, 42, 99, 3], seed=1)
    assert audio.sample_rate == 24000 and len(audio.samples) > 0 and np.isfinite(audio.samples).all()
    with pytest.raises(CheckpointError, match="no text tokenizer"):
        tts.synthesize("Hello")
    with pytest.raises(CheckpointError, match="campplus.onnx|speech_tokenizer"):
        tts.synthesize(text_ids=[5, 6], prompt_wav=(_tone(2.0), SR_PROMPT))


def test_store_voices_are_usable_as_speakers(cv2_dir, tmp_path, prompt_wav):
    from cadenza.voices import VoiceStore

    model_dir = build_toy_model_dir(cv2_dir, tmp_path / "model")
    with VoiceStore(tmp_path / "voices") as store:
        store.add("Narrator", prompt_wav, "Just by listening a few minutes a day.", consent="I consent to cloning.")
    with Cadenza.from_pretrained(model_dir, voices_dir=tmp_path / "voices") as tts:
        req = tts.request(TEXT, speaker="Narrator", seed=2)
        assert req.mode == "zero_shot" and req.lm_prompt_speech.shape[1] > 0
        direct = tts.request(TEXT, prompt_wav=prompt_wav, prompt_text="Just by listening a few minutes a day.", seed=2)
        # the store keeps the prompt as 16-bit WAV, so features agree up to quantisation
        assert torch.allclose(req.voice.embedding, direct.voice.embedding, atol=1e-3)
        with pytest.raises(UnknownSpeakerError, match="unknown voice"):
            tts.request(TEXT, speaker="Nobody")


def test_families_are_registered_and_load_names_arguments_a_family_does_not_take(tmp_path):
    from cadenza.api import loading

    assert [f.name for f in loading.FAMILIES][:2] == ["cosyvoice2", "voxcpm2"]
    assert cadenza.model_family(cadenza.builtin.builtin_model_dir()) == "cosyvoice2"
    with pytest.raises(InputError, match="CosyVoice 2 models do not take lora"):
        cadenza.load(None, lora="x")
    with pytest.raises(InputError, match="already registered"):
        loading.register_family(loading.FAMILIES[0])
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(CheckpointError):
        cadenza.load(tmp_path)


def test_audio_saves_to_a_file_object_in_any_format_and_shows_a_player_in_a_notebook(tmp_path):
    import base64
    import re

    samples = (0.3 * np.sin(2 * np.pi * 180.0 * np.arange(12000) / 24000)).astype(np.float32)
    audio = cadenza.api.Audio(samples, 24000)
    for fmt, container in ((None, "WAV"), ("mp3", "MP3"), (".FLAC", "FLAC"), ("opus", "OGG"), ("ogg", "OGG")):
        buffer = io.BytesIO()
        audio.save(buffer, format=fmt)
        buffer.seek(0)
        info = sf.info(buffer)
        assert (info.format, info.samplerate, info.frames) == (container, 24000, 12000), fmt
    audio.save(tmp_path / "named.wav", format="flac")  # the format named wins over the suffix
    assert sf.info(str(tmp_path / "named.wav")).format == "FLAC"
    with pytest.raises(AudioError, match=r"cannot write \.m4a files"):
        audio.save(io.BytesIO(), format="m4a")
    html = audio._repr_html_()
    data = re.search(r'src="data:audio/wav;base64,([A-Za-z0-9+/=]+)"', html).group(1)
    played, rate = sf.read(io.BytesIO(base64.b64decode(data)), dtype="float32")
    assert rate == 24000 and np.abs(played - samples).max() <= 1 / 32767 and "0.50 s at 24000 Hz" in html


def test_tokenizer_windows_cover_a_long_source_cut_where_it_is_quiet():
    """A source past the speech tokenizer's 30 s is read in windows of at most 30 s, each cut at a token boundary at
    the quietest 40 ms of its last 5 s (``api/voice_conversion.py``)."""
    import torch

    from cadenza.api.voice_conversion import tokenizer_windows

    n = 16000 * 75
    wav = torch.full((n,), 0.3)
    wav[16000 * 27 + 640 * 3: 16000 * 27 + 640 * 4] = 0.0  # a quiet token 27.12 s in
    bounds = tokenizer_windows(n, wav16k=wav)
    assert bounds[0] == (0, 16000 * 27 + 640 * 3) and bounds[-1][1] == n
    assert all(a == b for (_, a), (b, _) in zip(bounds, bounds[1:]))  # contiguous
    assert all(b - a <= 16000 * 30 and a % 640 == 0 for a, b in bounds)
    assert tokenizer_windows(16000 * 30) == [(0, 16000 * 30)]
    assert len(tokenizer_windows(16000 * 61)) == 3  # without audio: cut at each window's end
