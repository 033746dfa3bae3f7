"""``AudioFileWriter``: audio written a piece at a time, whole or not at all."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from cadenza.audio.file_writer import AudioFileWriter
from cadenza.audio.io import save_audio
from cadenza.errors import AudioError, InputError

SR = 24000


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.parametrize("suffix", [".wav", ".flac"])
def test_pieces_give_the_file_of_the_whole(tmp_path, suffix):
    audio = _speechlike(3.0)
    save_audio(tmp_path / f"whole{suffix}", audio, SR)
    with AudioFileWriter(tmp_path / f"pieces{suffix}", SR) as writer:
        for piece in np.array_split(audio, [1, 999, 24000, 50000]):  # an empty piece too
            writer.write(piece)
        assert not (tmp_path / f"pieces{suffix}").exists()  # only the temporary file until commit
    assert writer.seconds == pytest.approx(3.0)
    whole, _ = sf.read(tmp_path / f"whole{suffix}", dtype="int16")
    pieces, rate = sf.read(tmp_path / f"pieces{suffix}", dtype="int16")
    assert rate == SR and np.array_equal(pieces, whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"whole{suffix}", f"pieces{suffix}"])  # no .tmp


@pytest.mark.parametrize("suffix, rate", [(".ogg", 22050), (".opus", 22050), (".mp3", 22050), (".opus", 48000)])
def test_lossy_formats_and_rates_they_do_not_take(tmp_path, suffix, rate):
    """Opus and MP3 take a few rates: another is resampled as it streams (22,050 Hz -> 24 kHz for Opus)."""
    audio = _speechlike(2.0)
    path = tmp_path / f"x{suffix}"
    with AudioFileWriter(path, rate) as writer:
        for piece in np.array_split(audio, 7):
            writer.write(piece)
    info = sf.info(path)
    assert abs(info.duration - audio.size / rate) < 0.1, (info.duration, audio.size / rate)
    assert (info.samplerate == 24000) if (suffix == ".opus" and rate == 22050) else info.samplerate in (rate, 48000)
    back, _ = sf.read(path, dtype="float32")
    assert np.abs(back).max() > 0.1  # the tone is there


def test_a_failure_leaves_the_target_as_it_was(tmp_path):
    target = tmp_path / "out.wav"
    target.write_bytes(b"old")
    with pytest.raises(AudioError, match="NaN"):
        with AudioFileWriter(target, SR) as writer:
            writer.write(_speechlike(0.5))
            writer.write(np.array([0.1, np.nan], np.float32))
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    with pytest.raises(RuntimeError):
        with AudioFileWriter(target, SR) as writer:
            writer.write(_speechlike(0.5))
            raise RuntimeError("the synthesis failed")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    with pytest.raises(AudioError, match="0 samples"):
        with AudioFileWriter(tmp_path / "empty.flac", SR):
            pass
    assert [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    with pytest.raises(InputError, match="cannot write"):
        AudioFileWriter(tmp_path / "missing" / "x.wav", SR)
    with pytest.raises(AudioError, match="cannot write .m4a"):
        AudioFileWriter(tmp_path / "x.m4a", SR)


def test_a_link_is_followed_and_stays_a_link(tmp_path):
    """The file a link ends at is replaced (atomically, beside it); the link itself is left as it is."""
    real, link = tmp_path / "real.wav", tmp_path / "link.wav"
    real.write_bytes(b"old")
    link.symlink_to("real.wav")
    with AudioFileWriter(link, 16000) as writer:
        writer.write(np.full(1600, 0.25, np.float32))
    assert link.is_symlink() and sf.info(str(real)).frames == 1600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.wav", "real.wav"]  # no temporary file left


def test_a_descriptor_path_is_written_in_place_never_renamed_over(tmp_path):
    """``/dev/stdout``-like paths (here a link to this process's own descriptor of an open file) are written
    through: the open file gets the audio and the link survives, where renaming over it lost the audio."""
    opened = tmp_path / "redirected.wav"
    with open(opened, "wb") as handle:
        link = tmp_path / "fakestdout"
        link.symlink_to(f"/proc/self/fd/{handle.fileno()}")
        with AudioFileWriter(link, 16000) as writer:
            writer.write(np.full(800, -0.5, np.float32))
    assert link.is_symlink()
    assert sf.info(str(opened)).frames == 800


def test_wav_into_a_pipe_is_refused_with_what_to_do_instead(tmp_path):
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    drained = threading.Thread(target=lambda: open(fifo, "rb").read())  # a reader, so opening for writing returns
    drained.start()
    with pytest.raises(InputError, match="pipe.*-o -"):
        AudioFileWriter(fifo, 16000)
    drained.join(timeout=10)


def test_stereo_a_folder_and_a_missing_folder_are_refused_clearly(tmp_path):
    """Several channels were flattened into one long mono track; libsndfile's "System error." named no cause."""
    from cadenza.api.audio import Audio

    stereo = np.zeros((2, 100), np.float32)
    with pytest.raises(AudioError, match=r"shape \(2, 100\): expected mono"):
        Audio(stereo, 24000).save(tmp_path / "s.wav")
    assert not list(tmp_path.iterdir())  # nothing half-written
    Audio(stereo[:1], 24000).save(tmp_path / "one.wav")  # [1, samples] is mono
    assert sf.info(str(tmp_path / "one.wav")).frames == 100
    with pytest.raises(InputError, match="it is a folder"):
        Audio(stereo[0], 24000).save(tmp_path)
    with pytest.raises(InputError, match="the folder .*no' does not exist"):
        Audio(stereo[0], 24000).save(tmp_path / "no" / "x.wav")
    with open(tmp_path / "t.wav", "w") as text_mode, pytest.raises(AudioError, match="binary mode"):
        Audio(stereo[0], 24000).save(text_mode)
