"""Self-made preference pairs for the ``dpo`` / ``asr_reward`` stages (``cadenza data dpo-pairs``).

See docs/training.md, "Reinforcement stage".

For every text of a manifest: sample N candidate token sequences from the model being tuned (candidate k of manifest
line i uses the seed ``seeding.item_seed(seed, i, k)``, recorded), synthesise each, score it — an offline ASR gives
the word (or character) error rate against the text, a speaker model the similarity to the prompt — and keep the
best vs the worst as a pair (``dpo_pairs.make_pairs``: only if their rewards differ by at least ``min_gap``)::

    reward = 1 - min(error_rate, 1) + similarity_weight * similarity   (similarity only for lines with a prompt_wav)

Manifest (JSON lines, read as a stream)::

    {"id": "utt1", "text": "What to say.", "prompt_wav": "optional.wav", "prompt_text": "optional", "speaker": "opt"}

(a ``.txt`` file is one text per line, ids ``line<N>``). Output folder:

* ``preference_pairs.jsonl`` — the pairs (``dpo_pairs`` format, with ``text`` and ``text_ids``, the rewards and
  the seeds of both sides);
* ``preference_candidates.jsonl`` — one line per manifest text, written last: status (``paired``, ``no_gap``,
  ``no_valid_candidate``, ``unspeakable``), reason, and every candidate (seed, tokens, transcript, error, similarity,
  reward). A rerun skips the texts listed here (resume) and drops pairs whose text is not listed (a run stopped
  between the two writes);
* ``dpo_pairs.json`` — the settings (N, seed, metric, weights, scorers); a rerun with other settings is refused.

Memory is bounded: one text's candidates at a time. The scorers are pluggable (``Transcriber`` /
``SpeakerSimilarity`` protocols, or ``--asr`` / ``--similarity MODULE:FACTORY[=ARG]`` on the command line); the
defaults come from the ``eval`` extra (faster-whisper base, Resemblyzer), run offline.

The pairs hold the target text only: a voice's LM prompt (prompt transcript + prompt tokens of a zero-shot line)
conditions the sampling but is not part of the pair, as the DPO stage trains without prompts.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from cadenza.errors import AudioError, CadenzaError, InputError, TextError
from cadenza.evaluation.audio import EVAL_SR, load_16k, to_16k_mono
from cadenza.evaluation.wer import edit_distance, normalize_text, words
from cadenza.training.dpo_pairs import check_pair, make_pairs
from cadenza.training.seeding import item_seed

PAIRS_NAME = "preference_pairs.jsonl"
CANDIDATES_NAME = "preference_candidates.jsonl"
SETTINGS_NAME = "dpo_pairs.json"
METRICS = ("wer", "cer")
MAX_MANIFEST_LINE = 1 << 20  # a text line, not a corpus: 1 MiB is far beyond any utterance
SALT_CANDIDATE = 7

log = logging.getLogger(__name__)


# -- scorers ------------------------------------------------------------------------------------------------------

@runtime_checkable
class Transcriber(Protocol):
    """Offline ASR: ``wav16 [samples]`` float32 at 16 kHz -> the recognised text."""

    name: str

    def transcribe(self, wav16: np.ndarray) -> str: ...


@runtime_checkable
class SpeakerSimilarity(Protocol):
    """Speaker similarity of two 16 kHz utterances (``[samples]`` float32); None when either holds no speech."""

    name: str

    def similarity(self, wav16: np.ndarray, prompt16: np.ndarray) -> float | None: ...


class WhisperTranscriber:
    """The evaluation's ASR (faster-whisper base, int8, beam 5; the ``eval`` extra), English by default, in one
    temperature-0 pass: without the evaluation's temperature fallback, which triples the cost on garbled
    candidates (the ones a pair is made of) and makes the transcript depend on a random draw."""

    def __init__(self, language: str = "en", beam_size: int = 5) -> None:
        from cadenza.evaluation import asr

        self.model = asr.load_asr()
        self.language, self.beam_size = language, beam_size
        self.name = f"{asr.ASR_NAME}, temperature 0, {language}"

    def transcribe(self, wav16: np.ndarray) -> str:
        if wav16.size == 0:
            return ""
        segments, _ = self.model.transcribe(wav16.astype(np.float32), language=self.language,
                                            beam_size=self.beam_size, temperature=0.0)
        return " ".join(s.text.strip() for s in segments).strip()


class ResemblyzerSimilarity:
    """The evaluation's speaker similarity (Resemblyzer GE2E cosine; the ``eval`` extra)."""

    def __init__(self) -> None:
        from cadenza.evaluation import speaker_similarity

        self.encoder = speaker_similarity.load_encoder()
        self.name = speaker_similarity.SIMILARITY_NAME
        self._prompt: tuple[int, np.ndarray] | None = None  # the last prompt's embedding (lines share prompts)

    def _embed(self, wav16: np.ndarray) -> np.ndarray | None:
        from cadenza.evaluation import speaker_similarity

        try:
            return speaker_similarity.embed(wav16, EVAL_SR, encoder=self.encoder)
        except AudioError:
            return None

    def similarity(self, wav16: np.ndarray, prompt16: np.ndarray) -> float | None:
        from cadenza.evaluation import speaker_similarity

        key = hash(prompt16.tobytes())
        if self._prompt is None or self._prompt[0] != key:
            self._prompt = (key, self._embed(prompt16))
        prompt, hyp = self._prompt[1], self._embed(wav16)
        return None if prompt is None or hyp is None else speaker_similarity.cosine(prompt, hyp)


def load_plugin(spec: str, what: str, protocol: type) -> Any:
    """``package.module:factory`` or ``package.module:factory=ARG`` -> the scorer the factory returns."""
    target, _, arg = spec.partition("=")
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise InputError(f"{what} scorer {spec!r} must look like 'package.module:factory[=ARG]'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot load the {what} scorer {spec!r}: {exc}") from exc
    scorer = factory(arg) if arg else factory()
    if not isinstance(scorer, protocol):
        raise InputError(f"{spec!r} did not return a {what} scorer (needs .name and the {protocol.__name__} method)")
    return scorer


def error_rate(reference: str, hypothesis: str, metric: str) -> float:
    """WER (normalised words) or CER (characters of the normalised text, spaces included) of one candidate."""
    if metric == "wer":
        ref, hyp = words(reference), words(hypothesis)
    else:
        ref, hyp = list(normalize_text(reference)), list(normalize_text(hypothesis))
    if not ref:
        raise TextError(f"the text {reference!r} has no words to score after normalisation")
    return edit_distance(ref, hyp) / len(ref)


def candidate_reward(error: float, similarity: float | None, similarity_weight: float) -> float:
    """Higher is better: ``1 - min(error, 1) + similarity_weight * similarity`` (the similarity term only when
    known). The error is capped at 1 because an ASR's hallucinated repetition loop on poor audio (Whisper at
    temperature 0 writes "let's look, let's look, ..." for a 2.6 s clip) would otherwise outweigh everything."""
    return 1.0 - min(error, 1.0) + (similarity_weight * similarity if similarity is not None else 0.0)


# -- the manifest -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ManifestLine:
    index: int  # 0-based position among the manifest's texts (the seeds depend on it)
    line: int  # 1-based line number in the file (for messages)
    id: str
    text: str
    prompt_wav: Path | None = None
    prompt_text: str | None = None
    speaker: str | None = None


def _text_field(entry: dict, key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(f"{where}: {key!r} must be a string")
    return value


def read_manifest(path: str | Path) -> Iterator[ManifestLine]:
    """The texts of a manifest, one at a time (JSONL, or ``.txt`` with one text per line). Malformed lines, missing
    text and repeated ids raise ``InputError`` naming the line; a manifest without any text raises too."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"manifest not found: {path}")
    plain = path.suffix == ".txt"
    seen: set[str] = set()
    index = 0
    with path.open(encoding="utf-8") as f:
        for number, raw in enumerate(f, start=1):
            if len(raw) > MAX_MANIFEST_LINE:
                raise InputError(f"{path} line {number}: longer than {MAX_MANIFEST_LINE} characters")
            line = raw.strip()
            if not line or (plain and line.startswith("#")):
                continue
            where = f"{path} line {number}"
            if plain:
                entry: dict = {"id": f"line{number}", "text": line}
            else:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where}: not valid JSON ({exc.msg})") from exc
                if not isinstance(entry, dict):
                    raise InputError(f"{where}: expected a JSON object")
            text = _text_field(entry, "text", where)
            if not text or not text.strip():
                raise InputError(f"{where}: 'text' is missing or empty")
            utt = str(entry.get("id") or f"line{number}")
            if utt in seen:
                raise InputError(f"{where}: id {utt!r} appears twice (ids name the pairs and the resume state)")
            seen.add(utt)
            prompt = _text_field(entry, "prompt_wav", where)
            prompt_path = None
            if prompt:
                prompt_path = Path(prompt).expanduser()
                prompt_path = prompt_path if prompt_path.is_absolute() else path.parent / prompt_path
                if not prompt_path.is_file():
                    raise InputError(f"{where}: prompt_wav not found: {prompt_path}")
            yield ManifestLine(index=index, line=number, id=utt, text=text.strip(), prompt_wav=prompt_path,
                               prompt_text=_text_field(entry, "prompt_text", where),
                               speaker=_text_field(entry, "speaker", where))
            index += 1
    if index == 0:
        raise InputError(f"manifest {path} holds no texts (expected JSON lines with a 'text' field"
                         f"{'' if not plain else ', or one text per line'})")


def check_manifest(path: str | Path) -> int:
    """Read the whole manifest once (a stream: only the ids are kept) and return its number of texts; every error
    ``read_manifest`` finds is raised now, before a model is loaded or a candidate made."""
    return sum(1 for _ in read_manifest(path))


# -- generation ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PairSettings:
    """Everything that decides the pairs (a resumed run must use the same)."""

    candidates: int = 4
    seed: int = 0
    min_gap: float = 0.05
    metric: str = "wer"
    similarity_weight: float = 0.5
    asr: str = ""
    similarity: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.candidates, int) or self.candidates < 2:
            raise InputError(f"candidates must be an integer >= 2 (best vs worst), got {self.candidates!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise InputError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.metric not in METRICS:
            raise InputError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if not self.min_gap >= 0 or not self.similarity_weight >= 0:
            raise InputError("min_gap and similarity_weight must be >= 0")


@dataclass
class Summary:
    texts: int = 0
    skipped_done: int = 0
    pairs: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # "id: reason" of texts without a pair (first 20)

    def count(self, status: str, utt: str, reason: str) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status != "paired" and len(self.problems) < 20:
            self.problems.append(f"{utt}: {reason}")


def _read_done(path: Path) -> set[str]:
    """Ids listed in the candidates log; a torn last line (a run killed mid-write) is dropped from the file."""
    if not path.is_file():
        return set()
    done: set[str] = set()
    good_bytes = 0
    with path.open("rb") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
                done.add(str(entry["id"]))
                good_bytes += len(raw)
            except (ValueError, KeyError, TypeError):
                log.warning("%s: dropping an unreadable line after %d complete ones", path, len(done))
                break
    if good_bytes != path.stat().st_size:
        with path.open("rb+") as f:
            f.truncate(good_bytes)
    return done


def _keep_pairs_of(path: Path, done: set[str]) -> None:
    """Rewrite the pairs file without pairs of texts not in ``done`` (streamed through a temporary file)."""
    if not path.is_file():
        return
    tmp = path.with_name(f".{path.name}.tmp")
    dropped = 0
    with path.open(encoding="utf-8") as src, tmp.open("w", encoding="utf-8") as dst:
        for raw in src:
            try:
                keep = str(json.loads(raw)["id"]) in done
            except (ValueError, KeyError, TypeError):
                keep = False
            if keep:
                dst.write(raw if raw.endswith("\n") else raw + "\n")
            else:
                dropped += 1
    os.replace(tmp, path)
    if dropped:
        log.info("%s: dropped %d pairs of texts that were not finished", path, dropped)


def _check_settings(out: Path, settings: PairSettings) -> None:
    path = out / SETTINGS_NAME
    mine = {k: getattr(settings, k) for k in settings.__dataclass_fields__}
    if path.is_file():
        theirs = json.loads(path.read_text(encoding="utf-8"))
        if theirs != mine:
            diff = sorted(k for k in mine if theirs.get(k) != mine[k])
            raise InputError(f"{out} holds pairs made with other settings ({', '.join(diff)} differ): use a new --out "
                             f"or the same settings to resume")
    else:
        path.write_text(json.dumps(mine, indent=1) + "\n", encoding="utf-8")


class CandidateGenerator:
    """Samples, synthesises and scores candidates of one text with a CosyVoice 2 ``Cadenza``."""

    def __init__(self, tts, transcriber: Transcriber, similarity: SpeakerSimilarity | None,
                 settings: PairSettings) -> None:
        if getattr(tts, "family", None) != "cosyvoice2":
            raise InputError("dpo-pairs needs a CosyVoice 2 model (the LM being tuned); got "
                             f"{getattr(tts, 'family', type(tts).__name__)}")
        self.tts, self.transcriber, self.similarity_scorer, self.settings = tts, transcriber, similarity, settings

    def seeds(self, item: ManifestLine) -> list[int]:
        return [item_seed(self.settings.seed, item.index, k, SALT_CANDIDATE) for k in range(self.settings.candidates)]

    def candidates(self, item: ManifestLine) -> tuple[list[dict[str, Any]], list[int], list[str]]:
        """(scored candidates, text ids, reasons for invalid candidates). ``TextError`` / ``InputError``: the model
        cannot say the text (or the voice arguments are unusable)."""
        from cadenza.engine.request import SynthesisRequest

        engine = self.tts.engine
        base = self.tts.request(item.text, prompt_wav=item.prompt_wav, prompt_text=item.prompt_text,
                                speaker=item.speaker, seed=0)
        text_ids = base.text_ids[0].tolist()
        prompt16 = load_16k(item.prompt_wav) if item.prompt_wav is not None and self.similarity_scorer else None
        scored, invalid = [], []
        for seed in self.seeds(item):
            request = replace(base, seed=seed)
            tokens = [int(t) for t in engine.speech_tokens(request)]
            if not tokens:
                invalid.append(f"seed {seed}: the LM produced no speech tokens")
                continue
            # the flow + vocoder of exactly these tokens (the engine's batched path; the vocoder noise from the seed)
            wav = engine.synthesize(SynthesisRequest(mode="vc", voice=request.voice,
                                                     source_tokens=torch.tensor([tokens]), seed=seed))
            if wav.size == 0 or not np.isfinite(wav).all():
                invalid.append(f"seed {seed}: the synthesis is empty or not finite")
                continue
            wav16 = to_16k_mono(wav, self.tts.sample_rate)
            transcript = self.transcriber.transcribe(wav16)
            error = error_rate(item.text, transcript, self.settings.metric)
            similarity = self.similarity_scorer.similarity(wav16, prompt16) if prompt16 is not None else None
            scored.append({"seed": seed, "speech_tokens": tokens, "transcript": transcript, "error": error,
                           "similarity": similarity, "seconds": wav.size / self.tts.sample_rate,
                           "reward": candidate_reward(error, similarity, self.settings.similarity_weight)})
        return scored, text_ids, invalid


def generate_pairs(tts, manifest: str | Path, out_dir: str | Path, settings: PairSettings,
                   transcriber: Transcriber, similarity: SpeakerSimilarity | None = None,
                   progress: bool = True) -> Summary:
    """Write ``preference_pairs.jsonl`` + ``preference_candidates.jsonl`` into ``out_dir`` (resumable)."""
    if not isinstance(transcriber, Transcriber):
        raise InputError("the transcriber must have .name and .transcribe(wav16) -> str")
    if similarity is not None and not isinstance(similarity, SpeakerSimilarity):
        raise InputError("the similarity scorer must have .name and .similarity(wav16, prompt16)")
    manifest = Path(manifest)
    total = check_manifest(manifest)  # an empty or malformed manifest fails here, before any folder is made
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output folder {out}: {exc.strerror or exc}") from exc
    _check_settings(out, settings)
    generator = CandidateGenerator(tts, transcriber, similarity, settings)
    done = _read_done(out / CANDIDATES_NAME)
    _keep_pairs_of(out / PAIRS_NAME, done)
    summary = Summary()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, unit="text", dynamic_ncols=True)
    try:
        with (out / PAIRS_NAME).open("a", encoding="utf-8") as pairs_f, \
                (out / CANDIDATES_NAME).open("a", encoding="utf-8") as cands_f:
            for item in read_manifest(manifest):
                summary.texts += 1
                if item.id in done:
                    summary.skipped_done += 1
                else:
                    record, pair = _one_text(generator, item, settings)
                    summary.count(record["status"], item.id, record["reason"])
                    if pair is not None:
                        pairs_f.write(json.dumps(pair, ensure_ascii=False) + "\n")
                        pairs_f.flush()
                        summary.pairs += 1
                    cands_f.write(json.dumps(record, ensure_ascii=False) + "\n")  # last: the text is done
                    cands_f.flush()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(pairs=summary.pairs)
    finally:
        if bar is not None:
            bar.close()
    for problem in summary.problems:
        log.warning("no pair for %s", problem)
    total_pairs = _count_lines(out / PAIRS_NAME)
    if total_pairs == 0:
        raise CadenzaError(f"no preference pair was made from {manifest}: every text failed or its candidates scored "
                           f"alike ({'; '.join(summary.problems[:3])}); see {out / CANDIDATES_NAME}")
    return summary


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(encoding="utf-8") as f:
        return sum(1 for raw in f if raw.strip())


def _one_text(generator: CandidateGenerator, item: ManifestLine, settings: PairSettings
              ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    record: dict[str, Any] = {"id": item.id, "text": item.text, "line": item.line,
                              "seeds": generator.seeds(item), "candidates": []}
    try:
        scored, text_ids, invalid = generator.candidates(item)
    except (TextError, InputError) as exc:  # AudioError (a bad prompt) is an InputError too
        record.update(status="unspeakable", reason=f"the model cannot say it: {exc}")
        return record, None
    record["candidates"] = scored
    if len(scored) < 2:
        reason = f"{len(scored)} valid candidate(s) of {settings.candidates}, a pair needs 2"
        record.update(status="no_valid_candidate", reason=reason + (f" ({'; '.join(invalid[:3])})" if invalid else ""))
        return record, None
    group = [{"group": item.id, "text": item.text, "text_ids": text_ids, "speaker": item.speaker or "", **c}
             for c in scored]
    pairs = make_pairs(group, settings.min_gap)
    if not pairs:
        rewards = [c["reward"] for c in scored]
        record.update(status="no_gap", reason=f"rewards {min(rewards):.3f}..{max(rewards):.3f} differ by less than "
                                              f"min_gap {settings.min_gap}")
        return record, None
    check_pair(pairs[0])  # what read_pairs will accept
    record.update(status="paired", reason="")
    return record, pairs[0]
