"""Synthesise a test list, score it (WER, speaker similarity, naturalness, latency) and write the report.

Usable from Python without the CLI::

    from cadenza import load
    from cadenza.evaluation.runner import Evaluators, evaluate
    from cadenza.evaluation.test_list import read_test_list

    summary = evaluate(read_test_list("meta.lst"), "out/", tts=load("CosyVoice2-0.5B"), seed=0)

Each utterance is synthesised with ``synthesize_stream`` (as a streaming client would) so that first-chunk latency
(call -> first audio chunk, including prompt processing) and the real-time factor (compute seconds / audio
seconds) are measured on the same run that is scored. With ``wavs_dir`` nothing is synthesised and
``<wavs_dir>/<utt_id>.wav`` is scored instead (another synthesizer's output); with ``ground_truth=True`` the
list's ``target_wav`` recordings are scored (the ASR's own WER on real speech). Naturalness (the DistillMOS MOS
proxy) is scored when its weights are installed (``pip install --no-deps distillmos==0.9.1``); without them the
per-utterance figure is None and the summary's ``naturalness_note`` says why.

Output: ``<out>/wavs/<utt_id>.wav`` (synthesis only), ``<out>/results.jsonl`` (one line per utterance, written as
it is scored) and ``<out>/summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cadenza.audio.io import save_wav
from cadenza.errors import AudioError, CadenzaError, InputError, MissingDependencyError
from cadenza.evaluation import asr, naturalness, speaker_similarity
from cadenza.evaluation.audio import EVAL_SR, load_16k, to_16k_mono
from cadenza.evaluation.test_list import TestItem
from cadenza.evaluation.wer import WerScore, mean_wer, pooled_wer, score

log = logging.getLogger(__name__)


@dataclass
class UtteranceResult:
    """One line of ``results.jsonl``. Latency fields are None when the audio was not synthesised here;
    ``similarity`` is None without a prompt, with similarity off, or when no speech was found; ``naturalness``
    (predicted MOS, 1-5) is None without the DistillMOS weights or for empty or silent audio."""

    id: str
    target_text: str
    hypothesis: str
    wer: float
    errors: int
    ref_words: int
    similarity: float | None
    first_chunk_s: float | None
    rtf: float | None
    audio_s: float
    naturalness: float | None = None


@dataclass
class Synthesis:
    """Streamed synthesis of one utterance: ``samples`` ``[n]`` float32 at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int
    first_chunk_s: float | None  # None when the stream yielded nothing
    compute_s: float


class Evaluators:
    """The ASR model, the speaker encoder and the naturalness model, shared by all utterances. Any may be given
    (e.g. a model loaded once by the caller); a missing one is loaded on first use (``MissingDependencyError``
    without the extra). The naturalness model is optional: without its weights ``naturalness_model`` is None and
    ``naturalness_note`` says why."""

    def __init__(self, asr_model=None, encoder=None, *, naturalness_model=None, language: str = "en",
                 beam_size: int = 5, cpu_threads: int = 0) -> None:
        self._asr_model = asr_model
        self._encoder = encoder
        self._naturalness_model = naturalness_model
        self.naturalness_note: str | None = None  # why naturalness is not scored, once known
        self.language = language
        self.beam_size = beam_size
        self.cpu_threads = cpu_threads
        self._prompt_embeddings: dict[Path, np.ndarray | None] = {}

    @property
    def asr_model(self):
        if self._asr_model is None:
            self._asr_model = asr.load_asr(cpu_threads=self.cpu_threads)
        return self._asr_model

    @property
    def encoder(self):
        if self._encoder is None:
            self._encoder = speaker_similarity.load_encoder()
        return self._encoder

    @property
    def naturalness_model(self) -> naturalness.NaturalnessModel | None:
        """The DistillMOS model, or None when its weights are not installed (``CheckpointError`` if they do not
        fit: a broken install is reported, not skipped)."""
        if self._naturalness_model is None and self.naturalness_note is None:
            try:
                self._naturalness_model = naturalness.load_naturalness_model()
            except MissingDependencyError as exc:
                self.naturalness_note = f"naturalness not scored: {exc}"
                log.info("%s", self.naturalness_note)  # said once, in the summary (and by `cadenza eval`)
        return self._naturalness_model

    def prepare(self, similarity: bool = True) -> None:
        """Load the ASR model (and the speaker encoder with ``similarity``) now rather than on first use, and the
        naturalness model where its weights are installed."""
        _ = self.asr_model
        if similarity:
            _ = self.encoder
        _ = self.naturalness_model

    def transcribe(self, wav16: np.ndarray) -> str:
        """``wav16``: ``[samples]`` at 16 kHz -> text ("" for empty audio)."""
        if wav16.size == 0:
            return ""
        return asr.transcribe(wav16, EVAL_SR, language=self.language, beam_size=self.beam_size, model=self.asr_model)

    def prompt_embedding(self, path: Path) -> np.ndarray | None:
        """The embedding of a prompt file (computed once per file; None if it holds no speech)."""
        if path not in self._prompt_embeddings:
            self._prompt_embeddings[path] = self._embed(load_16k(path), str(path))
        return self._prompt_embeddings[path]

    def _embed(self, wav16: np.ndarray, what: str) -> np.ndarray | None:
        try:
            return speaker_similarity.embed(wav16, EVAL_SR, encoder=self.encoder)
        except AudioError as exc:
            log.warning("no speaker embedding for %s: %s", what, exc)
            return None

    def similarity(self, item: TestItem, wav16: np.ndarray) -> float | None:
        """Cosine between the prompt's and ``wav16``'s speaker; None without a prompt or without speech."""
        if item.prompt_wav is None or wav16.size == 0:
            return None
        prompt = self.prompt_embedding(item.prompt_wav)
        hyp = self._embed(wav16, item.utt_id) if prompt is not None else None
        return None if prompt is None or hyp is None else speaker_similarity.cosine(prompt, hyp)

    def naturalness(self, wav16: np.ndarray, what: str) -> float | None:
        """Predicted MOS (1-5) of ``wav16`` (16 kHz); None without the weights or for empty or silent audio."""
        model = self.naturalness_model
        if model is None or wav16.size == 0:
            return None
        try:
            return naturalness.naturalness(wav16, EVAL_SR, model=model)
        except AudioError as exc:
            log.warning("no naturalness score for %s: %s", what, exc)
            return None


def synthesis_kwargs(tts, item: TestItem, seed: int | None, speaker: str | None) -> dict:
    """The voice arguments of ``tts.synthesize_stream`` for one list line (CosyVoice 2 ``Cadenza`` or ``VoxCPM2``).

    A prompt with transcript: zero-shot (CosyVoice 2) / continuation (VoxCPM 2); a prompt without transcript:
    cross-lingual / reference voice; no prompt: ``speaker`` (a saved speaker or voice), else the model's default
    voice.
    """
    kwargs: dict = {"seed": seed}
    voxcpm = getattr(tts, "family", "cosyvoice2") == "voxcpm2"
    if item.prompt_wav is not None:
        if voxcpm and not item.prompt_text:
            kwargs["reference_wav"] = str(item.prompt_wav)
        else:
            kwargs["prompt_wav"] = str(item.prompt_wav)
            kwargs["prompt_text"] = item.prompt_text or None
    elif speaker is not None:  # a saved speaker or voice (VoxCPM 2: a saved voice of the store)
        kwargs["speaker"] = speaker
    return kwargs


def synthesize_streaming(tts, text: str, **kwargs) -> Synthesis:
    """Run ``tts.synthesize_stream(text, **kwargs)`` to the end, timing the first chunk and the whole run."""
    chunks: list[np.ndarray] = []
    first = None
    start = time.perf_counter()
    stream = tts.synthesize_stream(text, **kwargs)
    try:
        for chunk in stream:
            if first is None:
                first = time.perf_counter() - start
            chunks.append(np.asarray(chunk, dtype=np.float32).reshape(-1))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # frees the request if the loop stopped early
    compute = time.perf_counter() - start
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return Synthesis(samples=samples, sample_rate=int(tts.sample_rate), first_chunk_s=first, compute_s=compute)


def check_inputs(items: Sequence[TestItem], *, wavs_dir: str | os.PathLike | None = None,
                 ground_truth: bool = False, need_prompts: bool = True) -> None:
    """Fail before any work if a file that the run needs is missing (``InputError`` naming the line)."""
    for item in items:
        if need_prompts and item.prompt_wav is not None and not item.prompt_wav.is_file():
            raise InputError(f"{item.where}: prompt wav not found: {item.prompt_wav}")
        if wavs_dir is not None and not (Path(wavs_dir) / f"{item.utt_id}.wav").is_file():
            raise InputError(f"{item.where}: {Path(wavs_dir) / (item.utt_id + '.wav')} not found")
        if ground_truth:
            if item.target_wav is None:
                raise InputError(f"{item.where}: no target_wav (5th field) to score as ground truth")
            if not item.target_wav.is_file():
                raise InputError(f"{item.where}: target wav not found: {item.target_wav}")


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


BUSY_LOAD_PER_CPU = 1.5  # the run's own threads keep the load near the core count; well above it, someone else ran


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none, e.g. Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def busy_machine_note(load_max: float | None, cpus: int | None) -> str | None:
    """A warning when the machine was busy with other work during synthesis (latency and RTF then measure the
    contention, not the model), else None."""
    if load_max is None or not cpus or load_max <= BUSY_LOAD_PER_CPU * cpus:
        return None
    return (f"the machine was busy (1-minute load average up to {load_max:.1f} on {cpus} CPUs): first-chunk latency "
            "and RTF are not comparable with a quiet run")


def summarize(results: Sequence[UtteranceResult]) -> dict:
    """Corpus figures: WER (mean of per-utterance WERs, and pooled), similarity, naturalness, latency and RTF."""
    scores = [WerScore(r.errors, r.ref_words) for r in results]
    sims = [r.similarity for r in results if r.similarity is not None]
    mos = [r.naturalness for r in results if r.naturalness is not None]
    firsts = [r.first_chunk_s for r in results if r.first_chunk_s is not None]
    rtfs = [r.rtf for r in results if r.rtf is not None]
    return {
        "n": len(results),
        "wer_mean": mean_wer(scores),
        "wer_pooled": pooled_wer(scores),
        "similarity_mean": _mean(sims),
        "similarity_n": len(sims),
        "naturalness_mean": _mean(mos),
        "naturalness_n": len(mos),
        "first_chunk_s_mean": _mean(firsts),
        "first_chunk_s_p50": _percentile(firsts, 50),
        "first_chunk_s_p90": _percentile(firsts, 90),
        "rtf_mean": _mean(rtfs),
        "audio_s_total": float(sum(r.audio_s for r in results)),
    }


def evaluate(items: Sequence[TestItem], out_dir: str | os.PathLike, *, tts=None,
             wavs_dir: str | os.PathLike | None = None, ground_truth: bool = False, seed: int | None = 0,
             speaker: str | None = None, similarity: bool = True, evaluators: Evaluators | None = None,
             progress: Callable[[int, int, UtteranceResult], None] | None = None, meta: dict | None = None,
             spell_numbers: bool = False) -> dict:
    """Score ``items`` from exactly one audio source (``tts``, ``wavs_dir`` or ``ground_truth``); write the report
    into ``out_dir`` and return the summary. ``progress(done, total, result)`` is called after each utterance;
    ``meta`` is copied into the summary (e.g. the model and list paths); ``spell_numbers``: WER on both texts read out
    by the text normaliser (``wer.score``)."""
    sources = [tts is not None, wavs_dir is not None, ground_truth]
    if sum(sources) != 1:
        raise InputError("evaluate needs exactly one audio source: a model, a wav folder, or ground truth")
    if not items:
        raise InputError("no utterances to evaluate")
    check_inputs(items, wavs_dir=wavs_dir, ground_truth=ground_truth, need_prompts=tts is not None or similarity)
    evaluators = evaluators if evaluators is not None else Evaluators()
    evaluators.prepare(similarity)  # load them (or fail on a missing extra) before synthesising anything
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if tts is not None:
            (out / "wavs").mkdir(exist_ok=True)
    except OSError as exc:
        raise CadenzaError(f"cannot create the output folder {out}: {exc}") from exc
    results: list[UtteranceResult] = []
    loads: list[float] = []
    with open(out / "results.jsonl", "w", encoding="utf-8") as jsonl:
        for item in items:
            if tts is not None and (load := load_average()) is not None:
                loads.append(load)
            result = _evaluate_one(item, out, tts, wavs_dir, seed, speaker, evaluators, similarity, spell_numbers)
            jsonl.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
            jsonl.flush()  # a long run leaves its finished lines behind if it is stopped
            results.append(result)
            if progress is not None:
                progress(len(results), len(items), result)
    source = "synthesis" if tts is not None else "wavs" if wavs_dir is not None else "ground_truth"
    summary = {**(meta or {}), "source": source, "seed": seed if tts is not None else None,
               "asr": asr.ASR_NAME, "wer_text": "read out (spell_numbers)" if spell_numbers else "as written",
               "similarity_model": speaker_similarity.SIMILARITY_NAME if similarity else None,
               "naturalness_model": naturalness.NATURALNESS_NAME if evaluators.naturalness_model is not None else None,
               "naturalness_note": evaluators.naturalness_note, **summarize(results)}
    if tts is not None:  # latency figures are only as good as the machine was quiet
        cpus = os.cpu_count()
        load_max = max(loads) if loads else None
        summary.update(load_average_max=load_max, cpus=cpus, latency_note=busy_machine_note(load_max, cpus))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


def _evaluate_one(item: TestItem, out: Path, tts, wavs_dir, seed, speaker, evaluators: Evaluators,
                  similarity: bool, spell_numbers: bool = False) -> UtteranceResult:
    first_chunk = rtf = None
    try:
        if tts is not None:
            synth = synthesize_streaming(tts, item.target_text, **synthesis_kwargs(tts, item, seed, speaker))
            save_wav(out / "wavs" / f"{item.utt_id}.wav", synth.samples, synth.sample_rate)
            audio_s = len(synth.samples) / synth.sample_rate
            first_chunk = synth.first_chunk_s
            rtf = synth.compute_s / audio_s if audio_s > 0 else None
            wav16 = to_16k_mono(synth.samples, synth.sample_rate) if audio_s > 0 else np.zeros(0, np.float32)
        else:
            path = Path(wavs_dir) / f"{item.utt_id}.wav" if wavs_dir is not None else item.target_wav
            wav16 = load_16k(path)
            audio_s = wav16.size / EVAL_SR
    except CadenzaError as exc:  # name the utterance: a list of thousands is otherwise hard to debug
        raise type(exc)(f"{item.where}: {exc}") from exc
    hypothesis = evaluators.transcribe(wav16)
    wer_score = score(item.target_text, hypothesis, spell_numbers=spell_numbers)
    sim = evaluators.similarity(item, wav16) if similarity else None
    return UtteranceResult(id=item.utt_id, target_text=item.target_text, hypothesis=hypothesis, wer=wer_score.wer,
                           errors=wer_score.errors, ref_words=wer_score.ref_words, similarity=sim,
                           first_chunk_s=first_chunk, rtf=rtf, audio_s=audio_s,
                           naturalness=evaluators.naturalness(wav16, item.utt_id))
