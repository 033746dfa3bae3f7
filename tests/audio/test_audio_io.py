"""Audio loading, saving, resampling and prompt validation: real recordings, many rates, and every bad input."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.audio.io import load_audio, save_audio, save_wav
from cadenza.audio.prompt import validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.errors import AudioError, InputError

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_audio() -> Path:
    path = Path(os.environ.get("CADENZA_SHARED_AUDIO") or REPO_ROOT / "../shared/audio").resolve()
    if not (path / "transcripts.tsv").is_file():
        pytest.skip(f"shared recordings not found at {path} (set CADENZA_SHARED_AUDIO)")
    return path


@pytest.fixture(scope="module")
def recordings(shared_audio) -> list[dict[str, str]]:
    with open(shared_audio / "transcripts.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _sine(freq: float, sr: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(sr * seconds))) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _wav_bytes(samples: np.ndarray, sr: int, subtype: str = "PCM_16", fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, sr, subtype=subtype, format=fmt)
    return buf.getvalue()


def _peak_hz(wav: torch.Tensor, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(wav.numpy().astype(np.float64) * np.hanning(wav.numel())))
    return float(np.argmax(spectrum)) * sr / wav.numel()


# ---------------------------------------------------------------- real recordings


@pytest.mark.parametrize("target_sr", [16000, 24000])
def test_load_shared_recordings(shared_audio, recordings, target_sr):
    assert len(recordings) >= 4
    for rec in recordings:
        path = shared_audio / rec["file"]
        info = sf.info(str(path))
        assert info.samplerate == int(rec["sample_rate"]) and info.channels == int(rec["channels"])
        wav = load_audio(path, target_sr)
        assert wav.dtype == torch.float32 and wav.dim() == 1, rec["file"]
        expected = info.frames * target_sr / info.samplerate
        assert abs(wav.numel() - expected) <= 1, rec["file"]
        assert abs(wav.numel() / target_sr - float(rec["seconds"])) <= 0.01, rec["file"]
        assert float(wav.abs().max()) <= 1.05  # resampling may overshoot full scale a little, never by much
        validate_prompt_audio(wav, target_sr)  # real prompts are all acceptable


def test_stereo_recording_is_channel_mean(shared_audio, recordings):
    rec = next(r for r in recordings if int(r["channels"]) > 1)
    path = shared_audio / rec["file"]
    raw, sr = sf.read(str(path), dtype="float32", always_2d=True)
    wav = load_audio(path, sr)  # no resampling: exactly the channel mean
    np.testing.assert_array_equal(wav.numpy(), raw.mean(axis=1, dtype=np.float32))


def test_native_rate_is_untouched_and_sources_agree(shared_audio, recordings):
    rec = next(r for r in recordings if int(r["channels"]) == 1)
    path = shared_audio / rec["file"]
    raw, sr = sf.read(str(path), dtype="float32")
    from_path = load_audio(str(path), sr)
    np.testing.assert_array_equal(from_path.numpy(), raw)
    data = path.read_bytes()
    assert torch.equal(load_audio(data, sr), from_path)
    with open(path, "rb") as f:
        assert torch.equal(load_audio(f, sr), from_path)


# ---------------------------------------------------------------- rates, formats, channels


@pytest.mark.parametrize("sr", [8000, 11025, 16000, 22050, 44100, 48000, 96000])
def test_any_rate_round_trip_keeps_pitch(tmp_path, sr):
    path = tmp_path / f"sine_{sr}.wav"
    sf.write(str(path), _sine(440.0, sr, 1.0), sr, subtype="PCM_16")
    wav = load_audio(path, 24000)
    assert abs(wav.numel() - 24000) <= 1
    assert abs(_peak_hz(wav, 24000) - 440.0) <= 1.0
    assert abs(float(wav.abs().max()) - 0.5) < 0.01


@pytest.mark.parametrize(
    ("subtype", "fmt"),
    [
        ("PCM_U8", "WAV"),
        ("PCM_16", "WAV"),
        ("PCM_24", "WAV"),
        ("PCM_32", "WAV"),
        ("FLOAT", "WAV"),
        ("PCM_16", "FLAC"),
        ("VORBIS", "OGG"),
    ],
)
def test_formats_scale_to_unit_range(subtype, fmt):
    data = _wav_bytes(_sine(440.0, 16000, 0.5, amp=0.8), 16000, subtype=subtype, fmt=fmt)
    wav = load_audio(data, 16000)
    assert abs(float(wav.abs().max()) - 0.8) < 0.03, subtype
    assert abs(_peak_hz(wav, 16000) - 440.0) <= 2.0


def test_multichannel_is_averaged():
    left, right = _sine(440.0, 16000, 0.5), _sine(440.0, 16000, 0.5, amp=0.1)
    three = np.stack([left, right, np.zeros_like(left)], axis=1)
    wav = load_audio(_wav_bytes(three, 16000, subtype="FLOAT"), 16000)
    np.testing.assert_allclose(wav.numpy(), (left + right) / 3, atol=1e-6)


@pytest.mark.parametrize(("channels", "subtype", "fmt"), [(1, "PCM_16", "FLAC"), (3, "FLOAT", "WAV")])
def test_blockwise_decoding_equals_whole_file_read(channels, subtype, fmt):
    # Several decoding blocks long (2**18 samples per block, whatever the channel count), with and without a limit.
    rng = np.random.default_rng(0)
    samples = (rng.standard_normal((48000 * 7, channels)) * 0.1).astype(np.float32)
    data = _wav_bytes(samples, 48000, subtype=subtype, fmt=fmt)
    raw, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    expected = raw.mean(axis=1, dtype=np.float32) if channels > 1 else raw[:, 0]
    np.testing.assert_array_equal(load_audio(data, 48000).numpy(), expected)
    np.testing.assert_array_equal(load_audio(data, 48000, max_seconds=7.0).numpy(), expected)
    with pytest.raises(AudioError, match=r"too long: 7\.00 s, the limit is 6\.5 s"):
        load_audio(data, 48000, max_seconds=6.5)


def test_resample_lengths_and_identity():
    x = torch.randn(2, 4410, generator=torch.Generator().manual_seed(0)) * 0.1
    assert torch.equal(resample(x[0], 16000, 16000), x[0])
    y = resample(x, 44100, 16000)
    assert y.shape == (2, 1600) and y.dtype == torch.float32
    assert resample(torch.zeros(0), 44100, 16000).shape == (0,)


# ---------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    with pytest.raises(AudioError, match="not found"):
        load_audio(tmp_path / "nope.wav", 16000)


def test_directory(tmp_path):
    with pytest.raises(AudioError, match="not a file"):
        load_audio(tmp_path, 16000)


def test_empty_file_and_empty_bytes(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        load_audio(path, 16000)
    with pytest.raises(AudioError, match="empty"):
        load_audio(b"", 16000)


def test_text_file(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("this is not audio, just a text file\n" * 20)
    with pytest.raises(AudioError, match="cannot decode .*notes.wav"):
        load_audio(path, 16000)


def test_corrupt_bytes():
    good = _wav_bytes(_sine(440.0, 16000, 0.5), 16000)
    with pytest.raises(AudioError, match="cannot decode"):
        load_audio(bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8)), 16000)
    with pytest.raises(AudioError, match="cannot decode"):
        load_audio(good[:20], 16000)  # header cut before the data chunk


def test_zero_sample_file():
    with pytest.raises(AudioError, match="no audio samples"):
        load_audio(_wav_bytes(np.zeros(0, np.float32), 16000), 16000)


def test_too_big_upload():
    data = _wav_bytes(_sine(440.0, 16000, 1.0), 16000)
    with pytest.raises(AudioError, match="MiB limit"):
        load_audio(data, 16000, max_bytes=1000)
    with pytest.raises(AudioError, match="MiB limit"):
        load_audio(io.BytesIO(data), 16000, max_bytes=1000)
    assert load_audio(data, 16000, max_bytes=None).numel() == 16000


def test_unsupported_sample_rate():
    with pytest.raises(AudioError, match="sample rate 4000"):
        load_audio(_wav_bytes(_sine(440.0, 4000, 1.0), 4000), 16000)


def test_nan_in_float_file():
    samples = _sine(440.0, 16000, 1.0)
    samples[100] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        load_audio(_wav_bytes(samples, 16000, subtype="FLOAT"), 16000)


def test_text_mode_stream():
    with pytest.raises(AudioError, match="binary mode"):
        load_audio(io.StringIO("abc"), 16000)


def test_audio_error_is_an_input_error():
    with pytest.raises(InputError):
        load_audio(b"garbage", 16000)


# ---------------------------------------------------------------- prompt validation


def test_prompt_ok():
    wav = torch.from_numpy(_sine(220.0, 16000, 1.0, amp=0.1))
    assert validate_prompt_audio(wav, 16000) is wav
    validate_prompt_audio(wav.unsqueeze(0), 16000)


def test_prompt_too_short():
    with pytest.raises(AudioError, match=r"too short: 0\.30 s"):
        validate_prompt_audio(torch.from_numpy(_sine(220.0, 16000, 0.3)), 16000)


def test_prompt_too_long():
    with pytest.raises(AudioError, match=r"too long: 31\.00 s"):
        validate_prompt_audio(torch.from_numpy(_sine(220.0, 8000, 31.0)), 8000)


def test_prompt_silent():
    with pytest.raises(AudioError, match="silent"):
        validate_prompt_audio(torch.zeros(16000), 16000)
    with pytest.raises(AudioError, match="silent"):  # faint hiss below -60 dBFS peak
        validate_prompt_audio(torch.from_numpy(_sine(220.0, 16000, 1.0, amp=5e-4)), 16000)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_prompt_non_finite(bad):
    wav = torch.from_numpy(_sine(220.0, 16000, 1.0))
    wav[5] = bad
    with pytest.raises(AudioError, match="NaN or infinite"):
        validate_prompt_audio(wav, 16000)


def test_prompt_wrong_shape():
    with pytest.raises(AudioError, match="mono"):
        validate_prompt_audio(torch.zeros(2, 16000), 16000)


# ---------------------------------------------------------------- saving


def test_save_wav_round_trip_and_clipping(tmp_path):
    audio = torch.from_numpy(_sine(440.0, 24000, 0.5))
    audio[:10] = 2.0
    audio[10:20] = -2.0
    path = tmp_path / "out.wav"
    save_wav(path, audio.unsqueeze(0), 24000)
    info = sf.info(str(path))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (24000, 1, "PCM_16", audio.numel())
    pcm, _ = sf.read(str(path), dtype="int16")
    assert (pcm[:10] == 32767).all() and (pcm[10:20] == -32767).all()  # clipped, not wrapped
    back = load_audio(path, 24000)
    np.testing.assert_allclose(back[20:].numpy(), audio[20:].numpy(), atol=1 / 32767)


def test_save_wav_to_stream_and_rejects_nan():
    buf = io.BytesIO()
    save_wav(buf, np.zeros(100, np.float32), 16000)
    assert load_audio(buf.getvalue(), 16000).numel() == 100
    with pytest.raises(AudioError, match="NaN"):
        save_wav(io.BytesIO(), torch.tensor([0.0, math.nan]), 16000)
    with pytest.raises(AudioError, match="mono"):
        save_wav(io.BytesIO(), torch.zeros(2, 10), 16000)


def _voiced(sr: int, seconds: float = 1.0) -> np.ndarray:
    """A speech-like test signal: a 140 Hz tone with ten harmonics under a 4 Hz syllable envelope."""
    t = np.arange(int(sr * seconds)) / sr
    tone = sum(np.sin(2 * np.pi * 140.0 * k * t) / k for k in range(1, 11))
    return (0.25 * tone * (0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t))).astype(np.float32)


def _snr_db(reference: np.ndarray, decoded: np.ndarray, max_lag: int = 3) -> float:
    """SNR of ``decoded`` against ``reference`` at the best alignment within ``max_lag`` samples (codec delay)."""
    n = min(len(reference), len(decoded)) - 2 * max_lag
    best = -np.inf
    for lag in range(-max_lag, max_lag + 1):
        x, y = reference[max_lag:max_lag + n], decoded[max_lag + lag:max_lag + lag + n]
        best = max(best, 10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2)))
    return best


@pytest.mark.parametrize("suffix, sr, stored_sr", [
    (".flac", 24000, 24000), (".FLAC", 48000, 48000),
    (".ogg", 24000, 24000), (".opus", 24000, 24000), (".opus", 44100, 48000),  # Opus takes 8/12/16/24/48 kHz only
    (".mp3", 24000, 24000), (".mp3", 16000, 16000)])
def test_save_audio_writes_the_format_its_suffix_names(tmp_path, suffix, sr, stored_sr):
    audio = _voiced(sr)
    path = tmp_path / f"out{suffix}"
    save_audio(path, audio, sr)
    expected = {".flac": "FLAC", ".ogg": "OGG", ".opus": "OGG", ".mp3": "MP3"}[suffix.lower()]
    assert sf.info(str(path)).format == expected
    back, rate = sf.read(str(path), dtype="float32")
    assert rate == stored_sr and len(back) == round(len(audio) * stored_sr / sr)  # codec delay trimmed, no padding
    if suffix.lower() == ".flac":  # lossless: exactly the WAV file's samples
        save_wav(tmp_path / "same.wav", audio, sr)
        np.testing.assert_array_equal(back, sf.read(str(tmp_path / "same.wav"), dtype="float32")[0])
    else:
        reference = audio if stored_sr == sr else resample(torch.from_numpy(audio), sr, stored_sr).numpy()
        assert _snr_db(reference, back) > 12.0


def test_save_audio_refuses_other_formats_and_defaults_to_wav(tmp_path):
    with pytest.raises(AudioError, match=r"cannot write \.m4a files; name the output \.wav, \.flac, \.ogg, \.opus, "
                                         r"\.mp3"):
        save_audio(tmp_path / "x.m4a", np.zeros(100, np.float32), 24000)
    save_audio(tmp_path / "no_suffix", np.zeros(100, np.float32), 24000)
    assert sf.info(str(tmp_path / "no_suffix")).format == "WAV"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_suffix"]


def test_no_audio_is_a_readable_wav_or_ogg_file_and_an_error_for_the_others(tmp_path):
    for suffix in (".wav", ".ogg"):
        save_audio(tmp_path / f"empty{suffix}", np.zeros(0, np.float32), 24000)
        assert sf.info(str(tmp_path / f"empty{suffix}")).frames == 0
    for suffix in (".flac", ".opus", ".mp3"):  # libsndfile would write files it cannot open again
        with pytest.raises(AudioError, match=rf"no audio to write \(0 samples\): a \{suffix} file cannot hold none"):
            save_audio(tmp_path / f"empty{suffix}", np.zeros(0, np.float32), 24000)
        assert not (tmp_path / f"empty{suffix}").exists()
