"""One decode path for every audio reader (``cadenza.audio.io.decode_audio`` / ``load_audio``): the server's own
streamed FLAC (STREAMINFO total_samples = 0, which libsndfile reports as 2^63 frames and then failed on with
"Internal psf_fseek() failed") and the m4a (AAC) / WebM (Opus) recordings the server's voice upload takes are read the
same way from a path, bytes or a file object, so the Python API, the CLI and ``/v1/audio/detect`` read them too."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.audio.io import decode_audio, load_audio
from cadenza.audio.resample import resample
from cadenza.errors import AudioError

from test_server_harness import speech_prompt

SR = 24_000


def _tone(seconds: float, sr: int = SR, amp: float = 0.3) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * 440.0 * np.arange(round(sr * seconds)) / sr)).astype(np.float32)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def _server_streamed_flac(samples: np.ndarray, sr: int = SR) -> bytes:
    """FLAC as ``POST /v1/audio/speech`` streams it: the server's encoder, chunk by chunk, no length up front."""
    pytest.importorskip("av", reason="the server's FLAC encoder needs PyAV (the 'server' extra)")
    pytest.importorskip("fastapi", reason="cadenza.server needs the 'server' extra")
    from cadenza.server.encoding import make_encoder

    encoder = make_encoder("flac", sr)
    data = b"".join(encoder.encode(samples[i:i + 4800]) for i in range(0, samples.size, 4800)) + encoder.finish()
    assert data[:4] == b"fLaC" and int.from_bytes(data[18:26], "big") & ((1 << 36) - 1) == 0  # length "unknown"
    return data


def _av_encode(fmt: str, codec: str, samples: np.ndarray, sr: int) -> bytes:
    """``samples`` (mono float32) written with PyAV: ``ipod`` = .m4a (AAC), ``webm`` = WebM (Opus)."""
    av = pytest.importorskip("av", reason="PyAV writes the m4a / WebM inputs (and reads them back)")
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=sr, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = sr
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def _sources(data: bytes, tmp_path, name: str):
    """The same file as a path, a str path, bytes and an open binary file."""
    path = tmp_path / name
    path.write_bytes(data)
    return {"path": path, "str": str(path), "bytes": data, "file": io.BytesIO(data)}


# ---------------------------------------------------------------- the server's streamed FLAC


def test_streamed_flac_of_the_server_reads_from_path_bytes_and_file(tmp_path):
    samples = _tone(2.0)
    data = _server_streamed_flac(samples)
    expected = np.round(samples * 32767).astype(np.int16)  # the server writes 16-bit samples
    for kind, source in _sources(data, tmp_path, "streamed.flac").items():
        decoded, rate = decode_audio(source, max_seconds=30.0)
        assert rate == SR, kind
        np.testing.assert_allclose(decoded * 32768, expected, atol=1.0, err_msg=kind)  # lossless, every sample
        assert load_audio(source if kind != "file" else io.BytesIO(data), 16000).numel() == 32000, kind


def test_streamed_flac_still_stops_at_the_limit(tmp_path):
    data = _server_streamed_flac(_tone(3.0))
    (tmp_path / "long.flac").write_bytes(data)
    for source in (data, tmp_path / "long.flac"):
        with pytest.raises(AudioError, match=r"too long: more than 2 s, the limit is 2 s"):  # no length to refuse on
            load_audio(source, SR, max_seconds=2.0)


# ---------------------------------------------------------------- m4a (AAC) and WebM (Opus), through FFmpeg


@pytest.mark.parametrize("fmt, codec, name", [("ipod", "aac", "v.m4a"), ("webm", "libopus", "v.webm")])
def test_m4a_and_webm_read_from_path_bytes_and_file(tmp_path, fmt, codec, name):
    data = _av_encode(fmt, codec, _tone(2.0, 48_000), 48_000)
    with pytest.raises(sf.LibsndfileError):  # what libsndfile alone says: "Format not recognised"
        sf.info(io.BytesIO(data))
    for kind, source in _sources(data, tmp_path, name).items():
        decoded, rate = decode_audio(source, max_seconds=30.0)
        assert rate == 48_000 and abs(decoded.size / rate - 2.0) < 0.05, (kind, decoded.size)
        assert abs(_rms(decoded[24_000:72_000]) - 0.3 / 2**0.5) < 0.01, kind
        assert abs(load_audio(io.BytesIO(data) if kind == "file" else source, 16000).numel() - 32000) < 800, kind


def test_m4a_and_webm_keep_the_limits(tmp_path):
    m4a = _av_encode("ipod", "aac", _tone(4.0), SR)
    webm = _av_encode("webm", "libopus", _tone(4.0, 48_000), 48_000)
    with pytest.raises(AudioError, match=r"the audio data \(\d+ bytes\) is too long: 4\.\d\d s, the limit is 3 s"):
        load_audio(m4a, SR, max_seconds=3.0)  # the container states its duration: refused before decoding
    with pytest.raises(AudioError, match="too long"):
        load_audio(webm, SR, max_seconds=3.0)
    (tmp_path / "v.m4a").write_bytes(m4a)
    with pytest.raises(AudioError, match=r"is \d\.\d MiB, more than the 0\.0 MiB limit"):
        load_audio(tmp_path / "v.m4a", SR, max_bytes=100)
    (tmp_path / "v.m4a").write_bytes(m4a[:200])  # cut before its audio
    with pytest.raises(AudioError, match=r"cannot decode .*v\.m4a"):
        load_audio(tmp_path / "v.m4a", SR)


def test_what_ffmpeg_is_not_given():
    # Only M4A/MP4, WebM/Matroska and ADTS go to FFmpeg, by a named demuxer: a playlist that would make a probing
    # FFmpeg open other files is libsndfile's, and refused as not audio.
    playlist = b"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n"
    with pytest.raises(AudioError, match=r"cannot decode the audio data .*not recognised"):
        load_audio(playlist, SR)


def test_without_pyav_the_error_says_what_to_install(monkeypatch):
    m4a = _av_encode("ipod", "aac", _tone(1.0), SR)
    monkeypatch.setitem(sys.modules, "av", None)  # `import av` now raises ImportError
    with pytest.raises(AudioError, match=r"M4A/MP4 audio is read by FFmpeg through PyAV, which is not installed "
                                         r"\(pip install av"):
        load_audio(m4a, SR)
    assert load_audio(_encode_wav(_tone(1.0)), SR).numel() == SR  # libsndfile's formats need no PyAV


def _encode_wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, SR, format="WAV")
    return buf.getvalue()


# ---------------------------------------------------------------- the Python API and the CLI read them too


@pytest.fixture(scope="module")
def speech_m4a_webm(tmp_path_factory) -> dict[str, object]:
    samples, sr = speech_prompt(4.0)
    mono = samples.mean(axis=1).astype(np.float32) if samples.ndim == 2 else samples
    folder = tmp_path_factory.mktemp("recordings")
    out = {}
    for fmt, codec, name, rate in [("ipod", "aac", "en.m4a", sr), ("webm", "libopus", "en.webm", 48_000)]:
        x = mono if rate == sr else resample(torch.from_numpy(np.ascontiguousarray(mono)), sr, rate).numpy()
        out[name] = folder / name
        out[name].write_bytes(_av_encode(fmt, codec, np.ascontiguousarray(x, np.float32), rate))
    return out


def test_the_python_api_takes_m4a_and_webm_prompts(speech_m4a_webm):
    import cadenza
    from cadenza.api.audio import read_prompt_audio
    from cadenza.voices.validation import decode_prompt

    for path in speech_m4a_webm.values():
        wav, sr = read_prompt_audio(str(path), 24_000)
        assert sr == 24_000 and abs(wav.numel() / sr - 4.0) < 0.1, path
        prompt, rate = decode_prompt(path.read_bytes())  # the voice store's reader (`cadenza voices add`)
        assert abs(prompt.numel() / rate - 4.0) < 0.1, path
    small = _av_encode("ipod", "aac", _tone(2.0, 16_000), 16_000)  # stored at its own rate, not raised to 48 kHz
    assert decode_prompt(small)[1] == 16_000
    with cadenza.load() as tts:
        voice = tts.voice_from_audio(str(speech_m4a_webm["en.m4a"]))
        assert voice is not None
        audio = tts.synthesize("Hello there.", prompt_wav=str(speech_m4a_webm["en.webm"]), seed=1)
        assert audio.samples.size > 0


def test_cadenza_voices_add_takes_an_m4a(speech_m4a_webm, tmp_path, capsys):
    from helpers import run_cli

    code, out, err = run_cli(capsys, "voices", "--voices-dir", tmp_path / "voices", "add", "memo",
                             "--audio", speech_m4a_webm["en.m4a"], "--consent",
                             "I am the speaker in this recording and I agree to it being used.")
    assert code in (0, None), err
    assert '"name": "memo"' in out
    # and `cadenza speakers` lists it beside the model's own speakers (it listed only those)
    code, out, err = run_cli(capsys, "speakers", "--voices-dir", tmp_path / "voices")
    assert code in (0, None), err
    assert out.split() == ["joe", "memo"]
