"""Hostile and odd audio inputs: decompression bombs, lying headers, truncated files, not-audio, edge sizes, rates
and channel counts. Each is refused with a specific ``AudioError`` or accepted correctly, and user audio is never
decoded past the duration limit (so a small file cannot expand to gigabytes in memory)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cadenza.audio.io import load_audio
from cadenza.errors import AudioError
from cadenza.voices.validation import decode_prompt

BOMB_SR = 48_000
BOMB_SECONDS = 1800  # 30 min of silence: ~270 KB of FLAC, 346 MB of float32 once decoded


def _encode(samples: np.ndarray, sr: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


def _sine(sr: int, seconds: float, channels: int = 1, amp: float = 0.5) -> np.ndarray:
    x = (amp * np.sin(2 * np.pi * 440.0 * np.arange(round(sr * seconds)) / sr)).astype(np.float32)
    return x if channels == 1 else np.repeat(x[:, None], channels, axis=1)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def _flac_without_length(data: bytes, claimed: int = 0) -> bytes:
    """Set STREAMINFO's total-samples field (36 bits; 0 = unknown, as a streaming encoder writes it)."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # first metadata block is STREAMINFO
    out = bytearray(data)
    field = int.from_bytes(out[18:26], "big")  # rate (20 bits), channels (3), bits (5), total samples (36)
    out[18:26] = ((field & ~((1 << 36) - 1)) | claimed).to_bytes(8, "big")
    return bytes(out)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """30 min of silence at 48 kHz as FLAC, written in 1 min blocks."""
    path = tmp_path_factory.mktemp("bomb") / "silence.flac"
    with sf.SoundFile(str(path), "w", BOMB_SR, 1, format="FLAC", subtype="PCM_16") as f:
        minute = np.zeros(BOMB_SR * 60, np.float32)
        for _ in range(BOMB_SECONDS // 60):
            f.write(minute)
    return path


# ---------------------------------------------------------------- decompression bombs


def test_bomb_is_refused_from_its_header(bomb):
    data = bomb.read_bytes()
    assert len(data) < 400_000
    with pytest.raises(AudioError, match=r"is too long: 1800\.00 s, the limit is 30 s"):
        load_audio(data, 24000, max_seconds=30.0)
    with pytest.raises(AudioError, match=r"is too long: 1800\.00 s, the limit is 30 s"):
        decode_prompt(data, max_seconds=30.0)


def test_bomb_without_a_length_stops_at_the_limit(bomb):
    data = _flac_without_length(bomb.read_bytes())
    assert sf.info(io.BytesIO(data)).frames > 2**62  # libsndfile: length unknown
    with pytest.raises(AudioError, match=r"too long: more than 30 s, the limit is 30 s \(use a shorter clip\)"):
        load_audio(data, 24000, max_seconds=30.0)
    with pytest.raises(AudioError, match="too long: more than 30 s"):
        decode_prompt(data, max_seconds=30.0)


_RSS_PROBE = textwrap.dedent("""
    import io, json, resource, sys
    import numpy as np, soundfile as sf
    from cadenza.audio.io import load_audio
    from cadenza.errors import AudioError
    from cadenza.voices.validation import decode_prompt

    bomb = open(sys.argv[1], "rb").read()
    blind = bytearray(bomb)  # STREAMINFO without a length: only the decoding limit can stop it
    field = int.from_bytes(blind[18:26], "big")
    blind[18:26] = (field & ~((1 << 36) - 1)).to_bytes(8, "big")
    buf = io.BytesIO()
    sf.write(buf, np.full(4800, 0.1, np.float32), 48000, format="WAV")
    load_audio(buf.getvalue(), 24000, max_seconds=30.0)  # warm up libsndfile, soxr and torch first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    errors = []
    for call in (lambda: load_audio(bomb, 24000, max_seconds=30.0), lambda: decode_prompt(bomb),
                 lambda: load_audio(bytes(blind), 24000, max_seconds=30.0), lambda: decode_prompt(bytes(blind))):
        try:
            call()
        except AudioError as exc:
            errors.append(str(exc))
    growth_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # Linux: KiB
    print(json.dumps({"growth_mb": growth_kb / 1024, "errors": errors}))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_refusing_a_bomb_costs_little_memory(bomb):
    # A fresh process, so that the peak is not hidden by what this test session already touched. Decoding the
    # whole bomb would take >= 346 MB (48 kHz x 1800 s of float32); stopping at 30 s takes ~6 MB.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(bomb)], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result["errors"]) == 4 and all("too long" in e for e in result["errors"]), result
    assert result["growth_mb"] < 100, result


def test_ogg_and_mp3_past_the_limit():
    ogg = _encode(np.zeros(8000 * 60, np.float32), 8000, "OGG", "VORBIS")
    with pytest.raises(AudioError, match=r"too long: 60\.00 s, the limit is 30 s"):
        load_audio(ogg, 16000, max_seconds=30.0)
    # MP3 lengths are bit-rate estimates: they never refuse a file by themselves; decoding stops at the limit.
    mp3 = _encode(np.zeros(8000 * 60, np.float32), 8000, "MP3", "MPEG_LAYER_III")
    with pytest.raises(AudioError, match="too long: more than 30 s"):
        load_audio(mp3, 16000, max_seconds=30.0)
    assert abs(load_audio(mp3, 8000, max_seconds=61.0).numel() - 8000 * 60) <= 8000  # + encoder padding


def test_wav_headers_that_lie():
    data = bytearray(_encode(_sine(8000, 60.0), 8000, subtype="PCM_16"))
    assert data[36:40] == b"data"
    claims_10s = bytearray(data)
    claims_10s[40:44] = struct.pack("<I", 8000 * 2 * 10)  # holds 60 s, says 10 s: only 10 s is ever read
    assert load_audio(bytes(claims_10s), 8000, max_seconds=30.0).numel() == 8000 * 10
    streamed = bytearray(data)  # RIFF and data sizes "unknown" (0xFFFFFFFF), as a streaming writer leaves them
    streamed[4:8] = streamed[40:44] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(AudioError, match=r"too long: 60\.00 s, the limit is 30 s"):
        load_audio(bytes(streamed), 8000, max_seconds=30.0)
    assert load_audio(bytes(streamed), 8000, max_seconds=61.0).numel() == 8000 * 60
    flac = _flac_without_length(_encode(_sine(8000, 60.0), 8000, "FLAC"), claimed=8000 * 10)
    assert load_audio(flac, 8000, max_seconds=30.0).numel() == 8000 * 10  # libsndfile stops at the stated length


def test_limit_is_exact():
    data = _encode(_sine(16000, 2.0), 16000)
    assert load_audio(data, 16000, max_seconds=2.0).numel() == 32000
    with pytest.raises(AudioError, match=r"too long: 2\.00 s, the limit is 1\.999 s"):
        load_audio(data, 16000, max_seconds=1.999)
    blind = _flac_without_length(_encode(_sine(16000, 2.0), 16000, "FLAC"))
    with pytest.raises(AudioError, match=r"too long: more than 1\.999 s"):
        load_audio(blind, 16000, max_seconds=1.999)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_seconds"):
            load_audio(data, 16000, max_seconds=bad)


# ---------------------------------------------------------------- hostile and odd inputs


_FLAC_5S = _encode(_sine(16000, 5.0), 16000, "FLAC")
_WAV_5S = _encode(_sine(16000, 5.0), 16000)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"this is not audio, just some text\n" * 30, r"cannot decode the audio data \(1020 bytes\).*not recognised"),
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "cannot decode the audio data .*not a supported audio format"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", "cannot decode"),
        (_FLAC_5S[:3000], "cannot decode .*corrupt.*flac decoder lost sync"),
        (_FLAC_5S[:30], "cannot decode .*corrupt"),
        (_WAV_5S[:30], "cannot decode .*corrupt.*data"),
        (_encode(np.zeros(0, np.float32), 16000), "contains no audio samples"),
        (_encode(_sine(4000, 1.0), 4000), r"sample rate 4000 Hz; supported rates are 8000-192000 Hz"),
        (_encode(np.zeros((1600, 33), np.float32), 16000), "has 33 channels; at most 32 are supported"),
        (_encode(np.where(np.arange(16000) == 5, np.nan, _sine(16000, 1.0)).astype(np.float32), 16000,
                 subtype="FLOAT"), "contains NaN or infinite samples"),
        (_encode(_sine(16000, 600.0), 16000), r"too long: 600\.00 s, the limit is 30 s"),
    ],
    ids=["text", "png", "wav-header-only", "truncated-flac", "flac-cut-in-header", "wav-cut-in-header", "0-samples",
         "4-kHz", "33-channels", "nan", "10-minutes"],
)
def test_refused_with_a_specific_message(data, match):
    with pytest.raises(AudioError, match=match):
        load_audio(data, 24000, max_seconds=30.0)
    with pytest.raises(AudioError, match=match):
        decode_prompt(data, max_seconds=30.0)


@pytest.mark.parametrize(
    ("sr", "channels", "subtype", "fmt"),
    [(16000, 1, "PCM_U8", "WAV"), (96000, 1, "PCM_24", "WAV"), (192000, 1, "PCM_16", "WAV"),
     (8000, 1, "PCM_16", "WAV"), (11025, 1, "PCM_16", "FLAC"), (44100, 2, "PCM_16", "WAV"),
     (48000, 6, "PCM_16", "FLAC"), (22050, 2, "VORBIS", "OGG"), (48000, 1, "OPUS", "OGG")],
)
def test_odd_but_valid_audio_is_accepted(sr, channels, subtype, fmt):
    data = _encode(_sine(sr, 2.0, channels, amp=0.4), sr, fmt, subtype)
    wav = load_audio(data, 24000, max_seconds=30.0)
    assert abs(wav.numel() - 48000) <= 2 * 24000 * 0.01  # Opus/Vorbis pre-skip and padding: within 10 ms
    # The same tone in every channel: the channel mean is that tone (RMS 0.4 / sqrt 2), whatever the codec.
    assert abs(_rms(wav.numpy()[12000:36000]) - 0.4 / 2**0.5) < 0.01
    prompt, rate = decode_prompt(data)
    assert rate == min(sr, 48000) and abs(prompt.numel() / rate - 2.0) < 0.02


def test_truncated_wav_gives_what_is_there():
    # libsndfile reads a WAV's data up to the end of the file; a cut file is the audio before the cut.
    wav = load_audio(_WAV_5S[:32044], 16000, max_seconds=30.0)
    assert wav.numel() == 16000


def test_one_sample():
    data = _encode(np.array([0.5], np.float32), 16000)
    assert load_audio(data, 16000, max_seconds=30.0).numel() == 1
    with pytest.raises(AudioError, match=r"too short: 1 sample \(0\.0001 s\), need at least 0\.5 s"):
        decode_prompt(data)


# ---------------------------------------------------------------- the PyAV fallback (m4a, WebM) of the server


def _av_encode(fmt: str, codec: str, seconds: float, rate: int = 48000, layout: str = "mono") -> bytes:
    av = pytest.importorskip("av")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        channels = av.AudioLayout(layout).nb_channels
        second = np.repeat(_sine(rate, 1.0, amp=0.3)[None, :], channels, axis=0)  # planar [channels, samples]
        for _ in range(round(seconds)):
            frame = av.AudioFrame.from_ndarray(second, format="fltp", layout=layout)
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def decode_with_av():
    """The one decode path (``decode_audio``) on the uploads only FFmpeg reads, and on the bombs libsndfile reads."""
    pytest.importorskip("av")
    from cadenza.audio.io import decode_audio

    return lambda data, max_seconds: decode_audio(data, None, max_seconds=max_seconds)


def test_av_fallback_stops_at_the_limit(decode_with_av, bomb):
    with pytest.raises(AudioError, match=r"is too long: 60\.\d\d s, the limit is 30 s"):
        decode_with_av(_av_encode("ipod", "aac", 60), 30.0)  # m4a states its duration
    with pytest.raises(AudioError, match=r"is too long: 1800\.00 s"):
        decode_with_av(bomb.read_bytes(), 30.0)
    with pytest.raises(AudioError, match="is too long: more than 30 s"):
        decode_with_av(_flac_without_length(bomb.read_bytes()), 30.0)
    with pytest.raises(AudioError, match="is too long: more than 30 s"):
        decode_with_av(_av_encode("webm", "libopus", 40), 30.0)


def test_av_fallback_inputs(decode_with_av):
    # The channel mean, as load_audio down-mixes (FFmpeg's own mono down-mix of 5.1 peaked at 1.3 here).
    for fmt, codec, layout in [("ipod", "aac", "stereo"), ("webm", "libopus", "5.1")]:
        samples, rate = decode_with_av(_av_encode(fmt, codec, 2, layout=layout), 30.0)
        assert rate == 48000 and abs(samples.size / rate - 2.0) < 0.05, (fmt, layout)
        assert abs(_rms(samples[24000:72000]) - 0.3 / 2**0.5) < 0.01, (fmt, layout)
    m4a = _av_encode("ipod", "aac", 2)
    for data, match in [
        (b"this is not audio" * 10, "not a supported audio format"),
        (m4a[: len(m4a) // 2], "holds no audio stream|cannot decode"),
        (_encode(_sine(4000, 1.0), 4000), "sample rate 4000 Hz"),
        (_encode(np.zeros((1600, 33), np.float32), 16000), "has 33 channels; at most 32"),
        (_encode(np.zeros(0, np.float32), 16000), "contains no audio samples"),
    ]:
        with pytest.raises(AudioError, match=match):
            decode_with_av(data, 30.0)
