"""The provenance watermark (docs/provenance.md): streaming = whole, what the mark survives, no false alarms on
unmarked audio, clear errors, and ``cadenza detect``.

Marked audio is a synthetic speech-like signal (syllable-rate voiced buzz with a wandering pitch, and fricative
noise), so these run without any shared file; unmarked-speech tests read the shared recordings and skip without
them. ``benchmarks/watermark_robustness.py`` measures the same on the real recordings, at length.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cadenza.cli.main import main
from cadenza.errors import AudioError, InputError
from cadenza.provenance import Watermark, detector, payload_hash
from cadenza.provenance.channels import add_white_noise, codec_roundtrip, resample_np
from cadenza.provenance.keys import DEFAULT_KEY

AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or Path(__file__).resolve().parents[2] / "../shared/audio")
KEY = b"test key for the watermark tests"
PAYLOAD = 0xC0FFEE42


def speechlike(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """float32 ``[seconds * rate]``: voiced syllables at 4 Hz (pitch 90-150 Hz) and bursts of fricative noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    phase = 2 * np.pi * np.cumsum(120 + 30 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 40))
    hiss = np.fft.irfft(np.fft.rfft(rng.standard_normal(n)) * (np.fft.rfftfreq(n, 1 / rate) > 2500), n=n)
    syllables = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 2
    x = 0.15 * syllables * voiced + 0.05 * (np.sin(2 * np.pi * 1.3 * t) > 0.6) * hiss
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def snr_db(clean: np.ndarray, marked: np.ndarray) -> float:
    noise = (marked.astype(np.float64) - clean) ** 2
    return float(10 * np.log10(np.sum(clean.astype(np.float64) ** 2) / np.sum(noise)))


@pytest.fixture(scope="module", params=[24_000, 48_000], ids=["24k", "48k"])
def marked(request):
    rate = request.param
    clean = speechlike(3.0, rate)
    return rate, clean, Watermark(KEY, rate).embed(clean, PAYLOAD)


def shared_speech() -> list[tuple[np.ndarray, int]]:
    names = sorted(AUDIO_DIR.glob("*.wav")) if AUDIO_DIR.is_dir() else []
    if not names:
        pytest.skip(f"shared speech recordings not found in {AUDIO_DIR} (set CADENZA_SHARED_AUDIO)")
    out = []
    for path in names:
        audio, rate = sf.read(path, dtype="float32")
        out.append(((audio.mean(axis=1) if audio.ndim == 2 else audio).astype(np.float32), rate))
    return out


# -- streaming ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [16_000, 24_000, 44_100, 48_000])
def test_chunked_embedding_equals_whole_for_any_chunking(rate):
    wm = Watermark(KEY, rate)
    clean = speechlike(1.3, rate, seed=rate)
    whole = wm.embed(clean, PAYLOAD)
    assert whole.dtype == np.float32 and whole.shape == clean.shape
    rng = np.random.default_rng(rate)
    for trial in range(6):
        stream, parts, done = wm.embedder(PAYLOAD), [], 0
        high = (2, 50, 700, 5000, 30_000, 100_000)[trial]  # single samples up to chunks spanning many blocks
        while done < clean.size:
            size = int(rng.integers(0, high + 1))  # empty chunks included
            out = stream.push(clean[done: done + size])
            assert out.shape == clean[done: done + size].shape  # no delay: same length out, at once
            parts.append(out)
            done += size
        parts.append(stream.finish())
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_push_after_finish_is_refused():
    stream = Watermark(KEY, 24_000).embedder(1)
    stream.push(np.zeros(100, np.float32))
    assert stream.finish().size == 0
    with pytest.raises(RuntimeError, match="after finish"):
        stream.push(np.zeros(10, np.float32))


# -- the mark: level, payload, what it survives ------------------------------------------------------------------


def test_mark_is_quiet_and_carries_the_payload(marked):
    rate, clean, audio = marked
    assert snr_db(clean, audio) >= 30.0
    found = Watermark(KEY, rate).detect(audio, rate)
    assert found.found and found.payload == PAYLOAD and found.score > 15
    assert found.to_json() == {"found": True, "payload": "c0ffee42", "score": round(found.score, 2)}
    # Another key sees nothing; the unmarked original shows nothing.
    assert not Watermark(b"some other key", rate).detect(audio, rate).found
    assert not Watermark(KEY, rate).detect(clean, rate).found


@pytest.mark.parametrize("codec", ["mp3", "opus"])
def test_survives_lossy_codecs_at_64_kbit(marked, codec):
    pytest.importorskip("av")
    rate, _, audio = marked
    decoded, decoded_rate = codec_roundtrip(audio, rate, codec, 64_000)
    found = Watermark(KEY, rate).detect(decoded, decoded_rate)
    assert found.found and found.payload == PAYLOAD


def test_survives_resampling_to_16k(marked):
    rate, _, audio = marked
    found = Watermark(KEY, rate).detect(resample_np(audio, rate, 16_000), 16_000)
    assert found.found and found.payload == PAYLOAD


def test_survives_white_noise_at_20_db(marked):
    rate, _, audio = marked
    noisy = add_white_noise(audio, 20.0, np.random.default_rng(0))
    found = Watermark(KEY, rate).detect(noisy, rate)
    assert found.found  # the payload needs longer audio at this noise level (docs/provenance.md)
    assert found.payload in (None, PAYLOAD)


def test_half_second_crops_anywhere(marked):
    rate, _, audio = marked
    wm = Watermark(KEY, rate)
    for start in (0.0, 0.3137, 1.1, 2.45):
        begin = int(start * rate)
        found = wm.detect(audio[begin: begin + rate // 2], rate)
        assert found.found, start
        assert found.payload in (None, PAYLOAD)  # a payload read from 0.5 s is either right or withheld


def test_inverted_polarity_and_a_mark_in_longer_audio(marked):
    rate, clean, audio = marked
    wm = Watermark(KEY, rate)
    assert wm.detect(-audio, rate).payload == PAYLOAD
    # Marked speech spliced between stretches of unmarked speech.
    spliced = np.concatenate([speechlike(2.0, rate, seed=5), audio, speechlike(2.0, rate, seed=6)])
    assert wm.detect(spliced, rate).found


def hop_buzz(seconds: float, rate: int, level: float, seed: int = 1) -> np.ndarray:
    """``[seconds * rate]``: a waveform that repeats every 20 ms (1-7 kHz) plus 50 Hz mains hum, at RMS ~``level``:
    what a vocoder locked to 50 Hz mel frames, or a mains-powered recording, adds."""
    rng = np.random.default_rng(seed)
    period = rate // 50
    spectrum = np.fft.rfft(rng.standard_normal(period))
    freqs = np.fft.rfftfreq(period, 1 / rate)
    pattern = np.fft.irfft(spectrum * ((freqs > 900) & (freqs < 7100)), n=period)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    hum = sum(np.sin(2 * np.pi * 50 * k * t + k) / k for k in range(1, 20))
    return level * (np.tile(pattern / pattern.std(), n // period + 1)[:n] + 0.5 * hum / hum.std())


def test_a_20_ms_buzz_is_dropped_before_folding():
    rng = np.random.default_rng(3)
    buzz = hop_buzz(2.0, 16_000, 1.0)[1234:]  # any phase of the period
    assert np.sum(detector.drop_hop_periodic(buzz) ** 2) < 1e-6 * np.sum(buzz**2)
    noise = rng.standard_normal(buzz.size)
    assert np.sum(detector.drop_hop_periodic(noise) ** 2) > 0.97 * np.sum(noise**2)  # nothing repeats: kept
    # A buzz at 9x the noise's power: gone, with the ~1/13 of the noise that its local mean holds.
    mixed = detector.drop_hop_periodic(noise + 3 * buzz)
    assert np.sum((mixed - noise) ** 2) < 0.12 * np.sum(noise**2)


def test_the_payload_reads_through_a_20_ms_buzz():
    # Without dropping the buzz this clip is found but its payload is not read (the buzz folds coherently).
    clean = speechlike(3.0, 24_000) + hop_buzz(3.0, 24_000, 0.002).astype(np.float32)
    wm = Watermark(KEY, 24_000)
    found = wm.detect(wm.embed(clean, PAYLOAD), 24_000)
    assert found.found and found.payload == PAYLOAD
    assert not wm.detect(clean, 24_000).found


# -- no false alarms ---------------------------------------------------------------------------------------------


def test_no_detection_on_unmarked_speech_windows():
    wm = Watermark(DEFAULT_KEY, 24_000)
    scores = []
    for audio, rate in shared_speech():
        for seconds in (0.5, 2.0):
            length = int(seconds * rate)
            for begin in range(0, audio.size - length + 1, int(0.37 * rate)):
                found = wm.detect(audio[begin: begin + length], rate)
                assert not found.found and found.payload is None, (seconds, begin, found.score)
                scores.append(found.score)
    assert len(scores) > 50 and max(scores) < wm.threshold


def test_no_detection_on_silence_noise_and_tones():
    wm = Watermark(KEY, 48_000)
    rng = np.random.default_rng(0)
    t = np.arange(48_000) / 48_000
    signals = {"silence": np.zeros(48_000), "one sample": np.zeros(1), "dither": 1e-5 * rng.standard_normal(48_000),
               "white": 0.1 * rng.standard_normal(48_000), "tone 1 kHz": 0.5 * np.sin(2 * np.pi * 1000 * t),
               "tone 3.3 kHz": 0.5 * np.sin(2 * np.pi * 3300 * t), "clipped square": np.sign(np.sin(2 * np.pi * 220 * t)),
               "speech-like": speechlike(1.0, 48_000, seed=9)}
    for name, x in signals.items():
        found = wm.detect(x.astype(np.float32), 48_000)
        assert not found.found and found.payload is None, (name, found)
    assert wm.detect(np.zeros(48_000, np.float32), 48_000).score == 0.0


# -- configuration and inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"key": b""}, "key must be non-empty bytes"),
    ({"key": "text"}, "key must be non-empty bytes"),
    ({"sample_rate": 24000.0}, "sample_rate must be an int"),
    ({"sample_rate": "24000"}, "sample_rate must be an int"),
    ({"sample_rate": True}, "sample_rate must be an int"),
    ({"sample_rate": 8000}, "sample_rate must be 16000-192000 Hz"),
    ({"sample_rate": 22_025}, "multiple of 50 Hz"),
    ({"strength": 0.0}, "strength must be a finite number in"),
    ({"strength": float("nan")}, "strength must be a finite number in"),
    ({"min_snr_db": 5}, "min_snr_db must be a finite number in"),
    ({"threshold": -1}, "threshold must be a finite number in"),
])
def test_bad_configuration_is_refused_at_construction(kwargs, message):
    with pytest.raises(InputError, match=message):
        Watermark(**{"key": KEY, "sample_rate": 24_000, **kwargs})


def test_bad_audio_and_payloads_give_clear_errors():
    wm = Watermark(KEY, 24_000)
    ok = speechlike(0.6, 24_000)
    for audio, message in ((np.zeros(0, np.float32), "audio is empty"),
                           (np.array([0.1, np.nan], np.float32), "NaN or infinite"),
                           (np.array([0.1, np.inf]), "NaN or infinite"),
                           (np.zeros((2, 100), np.float32), r"mono, shape \[samples\]"),
                           (np.zeros(100, np.int16), "float samples"),
                           ([0.0, 0.1], "numpy array")):
        with pytest.raises(AudioError, match=message):
            wm.embed(audio, 1)
        with pytest.raises(AudioError, match=message):
            wm.detect(audio, 24_000)
    for rate, message in ((24000.0, "sample_rate must be an int"), (None, "sample_rate must be an int"),
                          (4000, "sample_rate must be 8000-192000 Hz")):
        with pytest.raises(InputError, match=message):
            wm.detect(ok, rate)
    for value in (-1, 2**32, 1.5, True, "1"):
        with pytest.raises(ValueError, match="payload must be an int"):
            wm.embed(ok, value)
    with pytest.raises(AudioError, match="NaN"):
        wm.embedder(1).push(np.array([np.nan], np.float32))


def test_payload_hash_is_stable_32_bits():
    value = payload_hash("cosyvoice2", "req-123")
    assert value == payload_hash("cosyvoice2", "req-123") != payload_hash("cosyvoice2", "req-124")
    assert 0 <= value < 2**32
    assert payload_hash("a", "bc") != payload_hash("ab", "c")  # parts are separated


# -- cadenza detect ----------------------------------------------------------------------------------------------


def test_cli_detect_on_a_written_wav(tmp_path, capsys):
    clean = speechlike(2.0, 24_000)
    marked_path, clean_path = tmp_path / "marked.wav", tmp_path / "clean.wav"
    sf.write(marked_path, Watermark(DEFAULT_KEY, 24_000).embed(clean, 0x0000BEEF), 24_000, subtype="PCM_16")
    sf.write(clean_path, clean, 24_000, subtype="PCM_16")
    assert main(["detect", str(marked_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["found"] is True and result["payload"] == "0000beef" and result["score"] > 10
    assert main(["detect", str(clean_path)]) == 0
    unmarked = json.loads(capsys.readouterr().out)
    assert unmarked["found"] is False and unmarked["payload"] is None and unmarked["score"] < 6
    # An operator's key: the public key's mark is not theirs, theirs is found with their key file only.
    key_file = tmp_path / "operator.key"
    # A fixed key: with random keys about 1 in 60 found the mark (score ~24) but decoded no payload from this 2 s clip
    # (measured 2026-12-05; noted for the watermark's owners), which made this test fail now and then.
    key_file.write_bytes(hashlib.sha256(b"an operator's key").digest())
    assert main(["detect", str(marked_path), "--key-file", str(key_file)]) == 0
    assert json.loads(capsys.readouterr().out)["found"] is False
    from cadenza.provenance.keys import load_key

    sf.write(marked_path, Watermark(load_key(key_file), 24_000).embed(clean, 7), 24_000, subtype="PCM_16")
    assert main(["detect", str(marked_path), "--key-file", str(key_file)]) == 0
    assert json.loads(capsys.readouterr().out)["payload"] == "00000007"


def test_cli_detect_errors_are_one_line(tmp_path, capsys):
    assert main(["detect", str(tmp_path / "missing.wav")]) == 2
    assert "error:" in capsys.readouterr().err
    short_key = tmp_path / "short.key"
    short_key.write_bytes(b"too short")
    wav = tmp_path / "a.wav"
    sf.write(wav, speechlike(0.5, 16_000), 16_000)
    assert main(["detect", str(wav), "--key-file", str(short_key)]) == 2
    assert "must hold 16-4096 bytes, got 9" in capsys.readouterr().err
    (tmp_path / "junk.wav").write_bytes(b"not audio at all")
    assert main(["detect", str(tmp_path / "junk.wav")]) == 2
    assert "cannot decode" in capsys.readouterr().err


def test_a_found_mark_recovers_its_payload_past_its_weakest_bits():
    """``decode_least_reliable``: one or two wrong bits among the three least reliable are put right (the CRC then
    matches); wrong bits the soft values are sure of are not (the payload stays unread rather than wrong)."""
    from cadenza.provenance import payload

    soft = payload.encode(0x0BADCAFE) * np.linspace(3.0, 8.0, payload.CODED_BITS)
    assert payload.decode(soft) == (0x0BADCAFE, True)
    weak = soft.copy()
    weak[[5, 20]] = [-0.2, 0.1] * -np.sign(soft[[5, 20]])  # two wrong, and the least reliable
    assert payload.decode(weak)[1] is False
    assert payload.decode_least_reliable(weak) == (0x0BADCAFE, True)
    sure = soft.copy()
    sure[[30, 40]] *= -1  # wrong and confident: not among the flips tried
    sure[[3, 4, 6]] = 0.05  # the weakest bits are right
    assert payload.decode_least_reliable(sure)[1] is False


def test_operator_keys_read_the_payload_of_a_short_clip():
    """Over 200 keys on a 2 s speech-like clip, every found mark gives its payload (before the weakest-bit retry, 1
    key in 60-200 found the mark and read no payload)."""
    clean = speechlike(2.0, 24_000)
    rng = np.random.default_rng(5)
    for _ in range(200):
        mark = Watermark(rng.bytes(32), 24_000)
        pcm = np.round(mark.embed(clean, 7) * 32767).clip(-32768, 32767) / 32767
        found = mark.detect(pcm.astype(np.float32), 24_000)
        assert found.found and found.payload == 7, (found.score, found.raw_payload)
