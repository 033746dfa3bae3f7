"""Feature extractors: one utterance in, named arrays out. Pluggable, so trained components can fill features later.

Protocol (any object with these three members works)::

    name: str                     # identifies the extractor (sidecar shard files are named after it)
    fields: tuple[str, ...]       # the arrays it returns
    __call__(utt: Utterance) -> dict[str, np.ndarray | torch.Tensor]

Raising any exception rejects the utterance with the message as the reason (preparation never stops for one item).
Built-in fields and their layout in the shards:

| field | dtype, shape | from |
| --- | --- | --- |
| ``wav`` | int16 ``[samples]`` at 24 kHz (x 1/32767 -> [-1, 1]) | ``WaveformExtractor`` |
| ``mel`` | float32 ``[frames, 80]`` (``flow_prompt_mel``, frames = samples // 480) | ``MelExtractor`` |
| ``f0`` | float32 ``[frames]`` Hz, 0 = unvoiced | ``F0Extractor`` |
| ``speech_tokens`` | int32 ``[tokens]`` (25 Hz) | ``SpeechTokenExtractor`` (``speech_tokenizer_v2.onnx`` or a trained one) |
| ``spk_emb`` | float32 ``[192]`` raw x-vector | ``SpeakerEmbeddingExtractor`` (``campplus.onnx`` or a trained one) |
| ``text_ids`` | int32 ``[n]`` Qwen2 (or phoneme) ids of the transcript | ``TextIdsExtractor`` (``CosyVoice-BlankEN``) |

An extractor run over a prepared corpus (``cadenza data extract``, ``add_features``) may also declare
``needs: tuple[str, ...]``: fields an earlier extraction stored (e.g. ``speech_tokens``); they arrive as
``utt.stored`` (an utterance lacking one is rejected with that reason), so a trained model can compute a feature
from another one — the vocoder's flow mels from the alignment's tokens (``cadenza.training.hift.flow_mels``).

A custom extractor is named on the command line as ``module.path:factory`` or ``module.path:factory=ARG`` (the factory
is called with ARG, e.g. a checkpoint path, or with no argument).
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.pitch import yin_f0
from cadenza.audio.resample import resample
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import MelConfig

log = logging.getLogger(__name__)

PCM_SCALE = 32767.0  # symmetric int16 scaling, as cadenza.audio.io.save_wav


@dataclass
class Utterance:
    """One validated utterance: mono float32 ``wav [samples]`` at ``sample_rate`` plus its metadata."""

    id: str
    text: str
    wav: torch.Tensor
    sample_rate: int
    speaker: str = ""
    language: str = ""
    stored: dict[str, torch.Tensor] = field(default_factory=dict)  # fields the extractor ``needs`` (module docstring)
    _resampled: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def audio_at(self, sample_rate: int) -> torch.Tensor:
        """The waveform at another rate (cached)."""
        if sample_rate == self.sample_rate:
            return self.wav
        if sample_rate not in self._resampled:
            self._resampled[sample_rate] = resample(self.wav, self.sample_rate, sample_rate)
        return self._resampled[sample_rate]


@runtime_checkable
class Extractor(Protocol):
    name: str
    fields: tuple[str, ...]

    def __call__(self, utt: Utterance) -> dict[str, Any]: ...


class WaveformExtractor:
    name, fields = "wav", ("wav",)

    def __init__(self, sample_rate: int = 24000) -> None:
        self.sample_rate = sample_rate

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        wav = utt.audio_at(self.sample_rate).clamp(-1.0, 1.0)
        return {"wav": torch.round(wav * PCM_SCALE).to(torch.int16)}


class MelExtractor:
    name, fields = "mel", ("mel",)

    def __init__(self, cfg: MelConfig | None = None) -> None:
        self.cfg = cfg or MelConfig()

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        mel = flow_prompt_mel(utt.audio_at(self.cfg.sampling_rate), self.cfg)  # [1, 80, frames]
        return {"mel": mel[0].transpose(0, 1).contiguous()}


class F0Extractor:
    name, fields = "f0", ("f0",)

    def __init__(self, cfg: MelConfig | None = None) -> None:
        self.cfg = cfg or MelConfig()

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        wav = utt.audio_at(self.cfg.sampling_rate)
        frames = wav.numel() // self.cfg.hop_size
        return {"f0": yin_f0(wav, self.cfg.sampling_rate, self.cfg.hop_size, frames)}


def _frontend(model_dir: str | Path):
    """A ``CosyVoice2Frontend`` over whatever frontend files ``model_dir`` has (weights are not needed): the release's
    ONNX models and BPE files, or a trained speech tokenizer / speaker encoder (``speech_tokenizer.safetensors``,
    ``speaker_encoder.safetensors``) and a phoneme table, as the built-in cadenza-tiny has. ``cadenza-tiny`` names
    the built-in folder."""
    from cadenza.builtin import local_model_path
    from cadenza.models.cosyvoice2.config import CosyVoice2Config
    from cadenza.models.cosyvoice2.frontend import CosyVoice2Frontend
    from cadenza.models.cosyvoice2.loader import BPE_FILES, CONFIG_NAMES, PHONEMES_FILE, QWEN_DIR, CosyVoice2Files

    d = local_model_path(model_dir)
    if not d.is_dir():
        raise InputError(f"model directory not found: {d}")
    blank = d / QWEN_DIR
    config = next((d / n for n in CONFIG_NAMES if (d / n).is_file()), d / CONFIG_NAMES[0])
    bpe = all((blank / n).is_file() for n in BPE_FILES)
    files = CosyVoice2Files(
        directory=d, config=config, qwen_config=blank / "config.json", weights={},
        tokenizer_dir=blank if bpe or (blank / PHONEMES_FILE).is_file() else None,
        campplus=d / "campplus.onnx" if (d / "campplus.onnx").is_file() else None,
        speech_tokenizer=d / "speech_tokenizer_v2.onnx" if (d / "speech_tokenizer_v2.onnx").is_file() else None,
    )
    return CosyVoice2Frontend(files, CosyVoice2Config.official()), files


class SpeechTokenExtractor:
    """25 Hz speech tokens from the model directory's speech tokenizer (``speech_tokenizer_v2.onnx``, or a trained
    ``speech_tokenizer.safetensors``; 16 kHz whisper log-mel in): the ids inference gives the same audio."""

    name, fields = "speech_tokens", ("speech_tokens",)

    def __init__(self, frontend) -> None:
        self.frontend = frontend

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        return {"speech_tokens": self.frontend.speech_tokens(utt.audio_at(16000))[0].to(torch.int32)}


class AlignedSpeechTokenExtractor:
    """25 Hz speech tokens of a phoneme frame classifier (cadenza-tiny's tokenizer) placed by forced alignment with
    the transcript (``cadenza.alignment.speech_labels``): the labels the model's corpus was made of, in the
    transcript's order, where the classifier's own best guess per frame is poor for a voice it never heard."""

    name, fields = "speech_tokens", ("speech_tokens",)

    def __init__(self, frontend, model_dir: Path) -> None:
        from cadenza.alignment.aligner import PhonemePosteriors

        self.frontend = frontend
        self.posteriors = PhonemePosteriors(model_dir)

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        from cadenza.alignment.speech_labels import aligned_labels

        ids = self.frontend.text_ids(utt.text, "the transcript")[0].tolist()
        logp = self.posteriors(utt.audio_at(16000).numpy())
        labels = aligned_labels(logp, ids, self.posteriors.symbols)
        return {"speech_tokens": torch.from_numpy(labels).to(torch.int32)}


class SpeakerEmbeddingExtractor:
    """The x-vector from the model directory's speaker encoder (``campplus.onnx``, or a trained
    ``speaker_encoder.safetensors``; 16 kHz Kaldi fbank in)."""

    name, fields = "spk_emb", ("spk_emb",)

    def __init__(self, frontend) -> None:
        self.frontend = frontend

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        return {"spk_emb": self.frontend.speaker_embedding(utt.audio_at(16000))[0].float()}


class TextIdsExtractor:
    """Text token ids of the transcript, as inference reads a segment (``CosyVoice2Frontend.text_ids``): Qwen2 BPE ids
    (``CosyVoice-BlankEN`` vocab.json + merges.txt), or phoneme ids (``phonemes.json``) ending as a sentence does."""

    name, fields = "text_ids", ("text_ids",)

    def __init__(self, frontend) -> None:
        self.frontend = frontend

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        return {"text_ids": self.frontend.text_ids(utt.text, "the transcript")[0].to(torch.int32)}


class ManifestArraysExtractor:
    """Integer arrays computed elsewhere, per utterance id, from a JSONL file (one object per line: ``id`` plus
    ``speech_tokens`` and/or ``text_ids`` lists) — e.g. tokens from a teacher's own alignment (recipes/tiny).
    A row may also give ``speech_rate``, a positive number stored as float32 ``[1]``: how many times faster than its
    speech tokens' own timeline the audio is read (speaking-rate pairs for the flow, ``training/flow_stage.py``); once
    one row gives it, a row without it stores 1.

    On the command line: ``--extractor cadenza.data.extractors:manifest_arrays=PATH``. An utterance the file does
    not list is rejected with that reason; the fields are those of the file's first line.
    """

    name = "manifest_arrays"
    _KNOWN = ("speech_tokens", "text_ids")

    def __init__(self, path: str | Path) -> None:
        self.rows: dict[str, dict[str, np.ndarray]] = {}
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise InputError(f"cannot read the arrays file {path}: {exc}") from exc
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                row = {k: np.asarray(raw[k], dtype=np.int32) for k in self._KNOWN if k in raw}
                key = str(raw["id"])
                rate = raw.get("speech_rate")
            except (ValueError, KeyError, TypeError) as exc:
                raise InputError(f"{path}:{n}: not an object with 'id' and integer lists: {exc}") from exc
            if not row or any(a.ndim != 1 or a.size == 0 for a in row.values()):
                raise InputError(f"{path}:{n}: needs non-empty 'speech_tokens' and/or 'text_ids' lists")
            if rate is not None:
                if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 16:
                    raise InputError(f"{path}:{n}: speech_rate must be a number in (0, 16), not {rate!r}")
                row["speech_rate"] = np.asarray([rate], dtype=np.float32)
            self.rows[key] = row
        if not self.rows:
            raise InputError(f"{path} lists no utterances")
        if any("speech_rate" in r for r in self.rows.values()):  # a row without one is read at its own rate
            for r in self.rows.values():
                r.setdefault("speech_rate", np.ones(1, dtype=np.float32))
        self.fields = tuple(next(iter(self.rows.values())))

    def __call__(self, utt: Utterance) -> dict[str, Any]:
        row = self.rows.get(utt.id)
        if row is None:
            raise InputError(f"{utt.id} is not in the arrays file")
        missing = [f for f in self.fields if f not in row]
        if missing:
            raise InputError(f"{utt.id} lacks {', '.join(missing)} in the arrays file")
        return {f: torch.from_numpy(row[f]) for f in self.fields}


def manifest_arrays(path: str) -> ManifestArraysExtractor:
    return ManifestArraysExtractor(path)


def default_extractors(mel: MelConfig | None = None, wav: bool = True, f0: bool = True) -> list[Extractor]:
    """What every prepared corpus holds: mel (+ 24 kHz waveform, + f0)."""
    out: list[Extractor] = [MelExtractor(mel)]
    if wav:
        out.append(WaveformExtractor((mel or MelConfig()).sampling_rate))
    if f0:
        out.append(F0Extractor(mel))
    return out


def _phoneme_frame_classifier(files) -> bool:
    """Whether the folder's speech tokenizer labels frames with the phonemes of its text table (cadenza-tiny):
    then a transcript fixes the label sequence, and alignment places it (``AlignedSpeechTokenExtractor``)."""
    from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
    from cadenza.models.speech_tokenizer.inference import CONFIG_NAME, find_speech_tokenizer, read_speech_tokenizer_json
    from cadenza.text.phonemes import PHONEMES_FILE, PhonemeTable

    table = files.tokenizer_dir / PHONEMES_FILE if files.tokenizer_dir is not None else None
    if find_speech_tokenizer(files.directory) is None or table is None or not table.is_file():
        return False
    doc = read_speech_tokenizer_json(files.directory / CONFIG_NAME)
    classes = SpeechTokenizerConfig.from_dict(doc["config"]).frame_classes
    return bool(classes) and classes % len(PhonemeTable.read(table).symbols) == 0


def model_dir_extractors(model_dir: str | Path) -> list[Extractor]:
    """Speech tokens, x-vectors and text ids from a model directory's frontend: a released folder's ONNX models and
    BPE files, or the trained tokenizer, speaker encoder and phoneme table of a folder such as the built-in
    cadenza-tiny (``model_dir="cadenza-tiny"``), whose voice a corpus can then fine-tune (docs/training.md)."""
    frontend, files = _frontend(model_dir)
    parts = {"speech_tokens": frontend.has_speech_tokenizer, "spk_emb": frontend.has_speaker_encoder,
             "text_ids": files.tokenizer_dir is not None}
    out: list[Extractor] = []
    if parts["speech_tokens"] and _phoneme_frame_classifier(files):
        log.info("speech tokens: the phoneme frame classifier's labels aligned with each transcript")
        out.append(AlignedSpeechTokenExtractor(frontend, files.directory))
    elif parts["speech_tokens"]:
        out.append(SpeechTokenExtractor(frontend))
    if parts["spk_emb"]:
        out.append(SpeakerEmbeddingExtractor(frontend))
    if parts["text_ids"]:
        out.append(TextIdsExtractor(frontend))
    if not out:
        raise InputError(f"{files.directory} has no speech tokenizer (speech_tokenizer_v2.onnx or "
                         "speech_tokenizer.safetensors), no speaker encoder (campplus.onnx or "
                         "speaker_encoder.safetensors) and no text tokenizer (CosyVoice-BlankEN/{vocab.json,merges.txt} "
                         "or phonemes.json): nothing to extract with --model")
    missing = [n for n, present in (("speech tokenizer", parts["speech_tokens"]),
                                    ("speaker encoder", parts["spk_emb"]), ("text tokenizer", parts["text_ids"]))
               if not present]
    if missing:
        log.warning("%s lacks a %s: those features are left for later", files.directory, ", ".join(missing))
    return out


def load_extractor(spec: str) -> Extractor:
    """``module.path:factory`` or ``module.path:factory=ARG`` -> the extractor the factory returns."""
    target, _, arg = spec.partition("=")
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise InputError(f"extractor spec {spec!r} must look like 'package.module:factory[=ARG]'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot load extractor {spec!r}: {exc}") from exc
    try:
        extractor = factory(arg) if arg else factory()
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plug-in's own failure, reported with the spec that named it
        raise InputError(f"extractor {spec!r} failed to start: {type(exc).__name__}: {exc}") from exc
    if not isinstance(extractor, Extractor) or not extractor.fields:
        raise InputError(f"{spec!r} did not return an extractor (needs .name, .fields and __call__)")
    return extractor


def to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)
