"""Reading and writing audio: any format libsndfile decodes, plus M4A/MP4, WebM/Matroska and ADTS AAC through FFmpeg
(PyAV), in; WAV, FLAC, Ogg Vorbis / Opus or MP3 out.

``decode_audio`` (native rate) and ``load_audio`` (resampled) are the one decode path for all user audio (paths, raw
bytes from an upload, open binary files): the Python API, the CLI, the voice, conversion and detect endpoints read
through them, with the same limits and fallbacks. They down-mix to mono by the channel mean (as the reference's
``load_wav`` does), scale integer formats to [-1, 1] (soundfile's float conversion), and ``load_audio`` resamples
with soxr (see ``resample.py`` for how that differs from the reference). Every failure is an ``AudioError`` whose
message says what is wrong with which input.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import torch

from cadenza.audio.resample import resample
from cadenza.audio.wav_stream import int16_samples
from cadenza.errors import AudioError

DEFAULT_MAX_BYTES = 50 * 2**20  # 50 MiB: ~4.5 min of 16-bit 48 kHz stereo; far beyond any sensible prompt
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 192_000
# More channels than any real recording has (7.1.4 is 12, ambisonics 3rd order is 16); a header claiming thousands is
# hostile, and every channel of a block is decoded before the down-mix.
MAX_CHANNELS = 32
_BLOCK_SAMPLES = 1 << 18  # samples (frames x channels) decoded per block: 1 MiB of float32
_UNKNOWN_FRAMES = 1 << 62  # libsndfile reports SF_COUNT_MAX frames when the header gives no length (streamed FLAC)
_MAX_PREALLOCATED = 1 << 28  # frames (1 GiB, virtual until written) reserved on the header's word; beyond: grow

AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO


def _describe(source: AudioSource) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"'{os.fspath(source)}'"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"the audio data ({len(source)} bytes)"
    name = getattr(source, "name", None)
    return f"'{name}'" if isinstance(name, str) else "the audio stream"


def _size_error(what: str, size: int, max_bytes: int) -> AudioError:
    return AudioError(
        f"{what} is {size / 2**20:.1f} MiB, more than the {max_bytes / 2**20:.1f} MiB limit "
        "(use a shorter clip, or raise max_bytes)"
    )


def _open_source(source: AudioSource, max_bytes: int | None) -> str | io.BytesIO:
    """Return something ``soundfile`` can read, after the existence / emptiness / size checks."""
    what = _describe(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            if not path.exists():
                raise AudioError(f"audio file not found: {what}")
            if not path.is_file():
                raise AudioError(f"{what} is not a file")
            if not os.access(path, os.R_OK):
                raise AudioError(f"audio file {what} is not readable (permission denied)")
            size = path.stat().st_size
        except OSError as exc:  # e.g. a name too long for the file system
            raise AudioError(f"cannot read audio file {what[:200]}: {exc.strerror or exc}") from exc
        if size == 0:
            raise AudioError(f"audio file {what} is empty (0 bytes)")
        if max_bytes is not None and size > max_bytes:
            raise _size_error(f"audio file {what}", size, max_bytes)
        return str(path)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "read"):
        # Read at most one byte past the limit, so an endless or huge upload never lands in memory whole.
        data = source.read(-1 if max_bytes is None else max_bytes + 1)
        if not isinstance(data, (bytes, bytearray)):
            raise AudioError(f"{what} must be opened in binary mode ('rb'), got {type(data).__name__}")
        data = bytes(data)
    else:
        raise AudioError(f"cannot read audio from a {type(source).__name__}; pass a path, bytes or a binary file")
    if not data:
        raise AudioError(f"{what} is empty (0 bytes)")
    if max_bytes is not None and len(data) > max_bytes:
        raise _size_error(what, len(data), max_bytes)
    return io.BytesIO(data)


def _too_long(what: str, seconds: float | None, max_seconds: float) -> AudioError:
    """``seconds``: the length the header gives, ``None`` when only the decoded part is known."""
    length = f"more than {max_seconds:g} s" if seconds is None else f"{seconds:.2f} s"
    return AudioError(f"{what} is too long: {length}, the limit is {max_seconds:g} s (use a shorter clip)")


def _decode(f: sf.SoundFile, what: str, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Mono float32 ``[frames]`` and the rate of the open file ``f``: the header is checked first, then the audio is
    read in blocks and down-mixed block by block, so at most ``max_seconds`` (plus one sample) of mono is held."""
    sample_rate, channels, frames = f.samplerate, f.channels, f.frames
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise AudioError(
            f"{what} has sample rate {sample_rate} Hz; supported rates are {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz"
        )
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"{what} has {channels} channels; at most {MAX_CHANNELS} are supported")
    cap = _UNKNOWN_FRAMES if max_seconds is None else math.floor(max_seconds * sample_rate) + 1  # frames to read
    # MP3 lengths are estimates (from the bit rate when there is no Xing/Info frame): never refuse on those.
    known = frames < _UNKNOWN_FRAMES and not f.subtype.startswith("MPEG_")
    if known and frames >= cap:
        raise _too_long(what, frames / sample_rate, max_seconds)  # refused before decoding anything
    # Headers can lie or be silent (streamed FLAC, Ogg, MP3), so the limit also holds for what is decoded.
    block = np.empty((max(1, _BLOCK_SAMPLES // channels), channels), np.float32)  # reused: 1 MiB
    out = np.empty(min(frames if known else len(block), cap, _MAX_PREALLOCATED), np.float32)
    total = 0
    while total < cap:
        got = f.read(min(len(block), cap - total), dtype="float32", always_2d=True, out=block)  # [n, channels]
        n = len(got)
        if n == 0:
            break
        if total + n > len(out):  # longer than the header said (or it said nothing): grow geometrically
            grown = np.empty(min(max(2 * len(out), total + n), cap), np.float32)
            grown[:total] = out[:total]
            out = grown
        if channels > 1:
            got.mean(axis=1, dtype=np.float32, out=out[total:total + n])
        else:
            out[total:total + n] = got[:, 0]
        if not np.isfinite(out[total:total + n]).all():
            raise AudioError(f"{what} contains NaN or infinite samples")
        total += n
    if total >= cap:
        raise _too_long(what, None, max_seconds)
    if total == 0:
        raise AudioError(f"{what} contains no audio samples")
    return (out if total == len(out) else out[:total].copy()), sample_rate  # a copy frees an oversized buffer


class _ForwardReader(sf.SoundFile):
    """A ``SoundFile`` read front to back, never seeking. soundfile seeks to where each read ended (where libsndfile
    already is); libFLAC cannot seek to the end of a stream whose STREAMINFO gives no length (a streamed FLAC, as the
    server writes it), so that seek failed ("Internal psf_fseek() failed") on the read that reached the end."""

    def seekable(self) -> bool:
        return False


# Containers libsndfile does not read, by their first bytes -> (FFmpeg demuxer, name). Only these go to FFmpeg, and by
# a named demuxer: FFmpeg never probes, so a file can never select demuxers that open other files or URLs (HLS
# playlists, concat lists). Everything else is libsndfile's alone, with its specific errors.
_FFMPEG_CONTAINERS = ((b"ftyp", 4, "mov", "M4A/MP4"), (b"\x1a\x45\xdf\xa3", 0, "matroska", "WebM/Matroska"))


def _ffmpeg_container(readable: str | io.BytesIO) -> tuple[str, str] | None:
    """``(demuxer, name)`` when ``readable`` starts like a container only FFmpeg reads, else None."""
    try:
        if isinstance(readable, str):
            with open(readable, "rb") as f:
                head = f.read(12)
        else:
            with readable.getbuffer() as view:
                head = bytes(view[:12])
    except OSError:
        return None
    for magic, offset, demuxer, name in _FFMPEG_CONTAINERS:
        if head[offset:offset + len(magic)] == magic:
            return demuxer, name
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:  # ADTS sync word and layer 0 (never MP3's)
        return "aac", "AAC (ADTS)"
    return None


def _decode_ffmpeg(readable: str | io.BytesIO, demuxer: str, name: str, what: str,
                   max_seconds: float | None) -> tuple[np.ndarray, int]:
    """``_decode`` for a container only FFmpeg reads: the same rate and channel limits, checked before decoding, the
    stated duration too (but not raw ADTS's, FFmpeg's estimate from the bit rate); decoding stops as soon as more
    than ``max_seconds`` came out, and the channels are averaged (FFmpeg's own down-mix weights them, and can exceed
    full scale)."""
    try:
        import av
    except ImportError as exc:
        raise AudioError(f"cannot decode {what}: {name} audio is read by FFmpeg through PyAV, which is not installed "
                         "(pip install av, or pip install 'cadenza[server]')") from exc
    cap, parts, total, rate = None, [], 0, 0  # cap: samples that make it too long, once the rate is known
    try:
        with contextlib.ExitStack() as stack:
            if isinstance(readable, str):
                file = stack.enter_context(open(readable, "rb"))  # a file object: FFmpeg opens no path or URL
            else:
                file = readable
                file.seek(0)
            container = stack.enter_context(av.open(file, mode="r", format=demuxer))
            if not container.streams.audio:
                raise AudioError(f"{what} holds no audio stream")
            stream = container.streams.audio[0]
            if stream.codec_context is None:  # a codec FFmpeg has no decoder for
                raise AudioError(f"cannot decode {what}: its audio codec is not supported")
            rate = stream.codec_context.sample_rate or stream.rate or 0
            channels = stream.codec_context.channels
            if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
                raise AudioError(f"{what} has sample rate {rate} Hz; supported rates are "
                                 f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz")
            if channels > MAX_CHANNELS:  # 0 (not known before decoding) is checked on each frame below
                raise AudioError(f"{what} has {channels} channels; at most {MAX_CHANNELS} are supported")
            if max_seconds is not None:
                cap = math.floor(max_seconds * rate) + 1
                if demuxer != "aac" and stream.duration and stream.time_base:
                    seconds = float(stream.duration * stream.time_base)
                    if seconds > max_seconds:
                        raise _too_long(what, seconds, max_seconds)
            resampler = av.AudioResampler(format="fltp", rate=rate)  # planar float, the stream's own layout
            # Lazily, one codec frame at a time; None at the end flushes the resampler.
            for frame in itertools.chain(container.decode(stream), [None]):
                if frame is not None and not 1 <= frame.layout.nb_channels <= MAX_CHANNELS:  # may change midway
                    raise AudioError(f"{what} has {frame.layout.nb_channels} channels; at most {MAX_CHANNELS} "
                                     "are supported")
                for out in resampler.resample(frame):
                    arr = out.to_ndarray()  # [channels, samples]
                    parts.append(arr.mean(axis=0, dtype=np.float32) if len(arr) > 1 else arr[0])
                    total += arr.shape[1]
                if cap is not None and total >= cap:
                    raise _too_long(what, None, max_seconds)
    except AudioError:
        raise
    except (av.error.FFmpegError, ValueError, OSError, IndexError, TypeError) as exc:
        raise AudioError(f"cannot decode {what}: not a supported audio format, or the file is corrupt "
                         f"(FFmpeg, {name}: {exc})") from exc
    if not total:
        raise AudioError(f"{what} contains no audio samples")
    samples = np.concatenate(parts).astype(np.float32, copy=False)
    if not np.isfinite(samples).all():
        raise AudioError(f"{what} contains NaN or infinite samples")
    return samples, int(rate)


def decode_audio(source: AudioSource, max_bytes: int | None = DEFAULT_MAX_BYTES, *,
                 max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode ``source`` to mono float32 ``[samples]`` at its own rate: ``(samples, rate)``.

    ``source``: a path, the raw bytes of an audio file, or a binary file object (read from its current position).
    Any container/codec libsndfile supports (WAV, FLAC -- streamed ones with no stated length too --, OGG/Vorbis,
    Opus, MP3 with libsndfile >= 1.1, ...); M4A/MP4 (AAC, ALAC), WebM/Matroska (Opus, Vorbis) and raw ADTS AAC, which
    libsndfile lacks, through FFmpeg (PyAV; an ``AudioError`` says to install it when it is missing). Any rate from 8
    to 192 kHz, with 1 to ``MAX_CHANNELS`` channels (averaged to mono). ``max_bytes`` bounds the encoded size,
    ``max_seconds`` the duration (``None``: no limit). The duration is checked on the header before decoding, and
    decoding stops as soon as more than ``max_seconds`` came out, so a small file that expands to hours of audio costs
    at most ``max_seconds`` of mono float32. Raises ``AudioError`` if the file is missing, empty, too big, too long,
    not decodable, has an unsupported rate or channel count, holds no samples, or holds NaN/inf samples.
    """
    if max_seconds is not None and not (max_seconds > 0 and math.isfinite(max_seconds)):
        raise ValueError(f"max_seconds must be positive and finite, or None; got {max_seconds}")
    what = _describe(source)
    readable = _open_source(source, max_bytes)
    try:
        with _ForwardReader(readable) as f:
            return _decode(f, what, max_seconds)
    except AudioError:
        raise
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as err:
        container = _ffmpeg_container(readable)
        if container is None:
            reason = getattr(err, "error_string", None) or str(err)  # libsndfile's reason, without the object repr
            raise AudioError(
                f"cannot decode {what}: not a supported audio format, or the file is corrupt ({reason})"
            ) from err
    return _decode_ffmpeg(readable, *container, what, max_seconds)


def load_audio(source: AudioSource, target_sr: int, max_bytes: int | None = DEFAULT_MAX_BYTES, *,
               max_seconds: float | None = None) -> torch.Tensor:
    """Decode ``source`` to mono float32 at ``target_sr``. Returns ``[samples]``.

    ``decode_audio`` (which formats, which limits, which errors), then resampled to ``target_sr`` with soxr.
    """
    if int(target_sr) <= 0:
        raise ValueError(f"target_sr must be positive, got {target_sr}")
    mono, sample_rate = decode_audio(source, max_bytes, max_seconds=max_seconds)
    return resample(torch.from_numpy(mono), sample_rate, int(target_sr))


# Output file formats by suffix -> (libsndfile container, encoding, the sample rates the codec takes or None: any).
# A rate the codec does not take is resampled to the next one up (the models' 16 / 24 / 44.1 / 48 kHz all fit).
OUTPUT_FORMATS = {
    ".wav": ("WAV", "PCM_16", None),
    ".flac": ("FLAC", "PCM_16", None),
    ".ogg": ("OGG", "VORBIS", None),
    ".opus": ("OGG", "OPUS", (8000, 12000, 16000, 24000, 48000)),
    ".mp3": ("MP3", "MPEG_LAYER_III", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
}


def output_format(path: str | os.PathLike) -> str:
    """The ``OUTPUT_FORMATS`` key for ``path``'s suffix (no suffix: ``.wav``); ``AudioError`` naming the formats
    for any other."""
    suffix = Path(path).suffix.lower() or ".wav"
    if suffix not in OUTPUT_FORMATS:
        raise AudioError(f"cannot write {suffix} files; name the output {', '.join(OUTPUT_FORMATS)}")
    return suffix


EMPTY_REFUSED = (".flac", ".opus", ".mp3")  # libsndfile writes them empty, but cannot read them back


def check_finite_output(data: np.ndarray) -> None:
    if not np.isfinite(data).all():
        raise AudioError("cannot save audio that contains NaN or infinite samples")


def check_not_empty(n_samples: int, fmt: str) -> None:
    if n_samples == 0 and fmt in EMPTY_REFUSED:
        raise AudioError(f"no audio to write (0 samples): a {fmt} file cannot hold none; use .wav")


def output_rate(fmt: str, sample_rate: int) -> int:
    """The rate ``fmt`` stores ``sample_rate`` audio at: the same, or the codec's next rate up (``OUTPUT_FORMATS``)."""
    rates = OUTPUT_FORMATS[fmt][2]
    if rates is None or sample_rate in rates:
        return int(sample_rate)
    return next((r for r in rates if r >= sample_rate), rates[-1])


def encoded_samples(data: np.ndarray, fmt: str) -> np.ndarray:
    """Float samples as ``fmt``'s encoder takes them: clipped to [-1, 1] (never wrapped), int16 for 16-bit PCM."""
    data = np.clip(data, -1.0, 1.0)
    return int16_samples(data) if OUTPUT_FORMATS[fmt][1] == "PCM_16" else data


def save_audio(path: str | os.PathLike | BinaryIO, audio: torch.Tensor | np.ndarray, sample_rate: int,
               fmt: str | None = None) -> None:
    """Write mono ``audio`` (``[samples]`` or ``[1, samples]``, float in [-1, 1]) in the format ``fmt`` (an
    ``OUTPUT_FORMATS`` key) or, by default, the one ``path``'s suffix names (WAV without one): 16-bit PCM WAV and
    FLAC (lossless: the same samples), Ogg Vorbis, Ogg Opus, MP3 (libsndfile's encoders; no FFmpeg needed).

    Values outside [-1, 1] are clipped (not wrapped). ``path`` may also be a binary file object (WAV unless ``fmt``).
    """
    data = audio.detach().cpu().float().numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio, np.float32)
    if data.ndim == 2 and data.shape[0] == 1:
        data = data[0]
    if data.ndim != 1:
        raise AudioError(f"cannot save audio of shape {data.shape}: expected mono [samples] or [1, samples]")
    check_finite_output(data)
    if fmt is None:
        fmt = output_format(path) if isinstance(path, (str, os.PathLike)) else ".wav"
    container, encoding, _ = OUTPUT_FORMATS[fmt]
    check_not_empty(data.size, fmt)
    sample_rate, rate = int(sample_rate), output_rate(fmt, sample_rate)
    data = np.clip(data, -1.0, 1.0)
    if rate != sample_rate:
        data = resample(torch.from_numpy(np.ascontiguousarray(data)), sample_rate, rate).numpy()
    target = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    sf.write(target, encoded_samples(data, fmt), rate, subtype=encoding, format=container)


def save_wav(path: str | os.PathLike | BinaryIO, audio: torch.Tensor | np.ndarray, sample_rate: int) -> None:
    """``save_audio`` as 16-bit PCM WAV whatever ``path`` is called."""
    save_audio(path, audio, sample_rate, ".wav")
