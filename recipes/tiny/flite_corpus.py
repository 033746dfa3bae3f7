"""More voices for cadenza-tiny's frame tokenizer: flite's voices reading corpus sentences, every 40 ms frame labelled
with our espeak-ng phoneme (x stress) from flite's own phone timings.

    python recipes/tiny/flite_corpus.py --out WORK/corpus_f --sentences WORK/corpus_v3/manifest.jsonl \\
        [--voices slt rms kal16] [--per-voice 2000] [--with-corpus WORK/corpus_v3]       (needs Debian's flite)

Why (docs/cadenza-tiny.md, "Voice conversion from other voices"): a frame tokenizer trained on joe alone labels other
voices' frames badly, so voice conversion from them (and the prompt tokens of a cloned voice) is gibberish; voice
augmentation of joe helps only part of the way. flite (CMU, BSD-style licence; a tool of the recipe, not a
dependency) speaks with recorded speakers' voices and prints when each phone ends (``-psdur``). Its phones are
ARPAbet from its own lexicon; ours are espeak-ng IPA characters (``cadenza.text.phonemes``, what the engine reads).
Each flite phone is spelt in IPA characters (``ay`` -> ``a ɪ``, its time split evenly), the two character strings
are aligned (edit distance: same character free, vowel for vowel or consonant for consonant cheaper than across,
pauses only with word breaks or the ends), and every espeak character takes the time of the flite character it
is aligned with; flite time left unaligned goes to the espeak character before it, and an espeak character flite
does not say keeps one frame. Labels: ``stress * S + symbol`` by ``aligned_corpus.labels_from_ends``, with its stress
and break rules, exactly as joe's corpus is labelled.

Writes ``manifest.jsonl`` and ``arrays.jsonl`` (as aligned_corpus.py), the wavs under ``wavs/<voice>/``, and
``alignment.json`` (the share of espeak characters aligned with a flite one of the same spelling, per voice).
``--with-corpus DIR`` adds that corpus's rows (e.g. joe's), paths relative to this folder, so one ``cadenza data
prepare`` covers all voices. Sentences come from ``--sentences`` (never the everyday test sentences: those are
kept out of corpus_v3 already). Resumable: existing wavs and labels are kept.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
from aligned_corpus import (  # joe's labels: the same stress and break rules
    BREAKS,
    STRESS,
    labels_from_ends,
    write_corpus,
)

PAUSE = "|"
TOKEN_RATE = 25  # speech tokens per second
# flite's US English phones (cmulex) spelt in espeak-ng's en-us characters.
ARPABET = {
    "aa": "ɑː", "ae": "æ", "ah": "ʌ", "ao": "ɔː", "aw": "aʊ", "ax": "ə", "axr": "ɚ", "ay": "aɪ", "eh": "ɛ", "er": "ɚ",
    "ey": "eɪ", "ih": "ɪ", "ix": "ᵻ", "iy": "iː", "ow": "oʊ", "oy": "ɔɪ", "uh": "ʊ", "uw": "uː", "b": "b", "ch": "tʃ",
    "d": "d", "dh": "ð", "dx": "ɾ", "el": "əl", "em": "əm", "en": "ən", "f": "f", "g": "ɡ", "hh": "h", "jh": "dʒ",
    "k": "k", "l": "l", "m": "m", "n": "n", "ng": "ŋ", "nx": "ɾ", "p": "p", "r": "ɹ", "s": "s", "sh": "ʃ", "t": "t",
    "th": "θ", "v": "v", "w": "w", "y": "j", "z": "z", "zh": "ʒ", "pau": PAUSE,
}
VOWELS = set("aeiouæɑɒɔəɚɛɜɐɪʊʌᵻɘɵɨʉøœɤɯyɶ")
LENGTH = "ː"
GAP_PHONE, GAP_BREAK = 0.8, 0.2


def flite_phones(voice: str, text: str, wav: Path) -> list[tuple[str, float]]:
    """Render ``text`` with flite's ``voice`` into ``wav``; returns (phone, end time in seconds) in order."""
    out = subprocess.run(["flite", "-voice", voice, "-psdur", "-t", text, "-o", str(wav)], check=True,
                         capture_output=True, text=True).stdout
    phones = []
    for item in out.split():
        name, _, end = item.rpartition(":")
        phones.append((name, float(end)))
    return phones


def flite_chars(phones: list[tuple[str, float]]) -> list[tuple[str, float, float]]:
    """Phones -> IPA characters with their (start, end) seconds, each phone's time split evenly."""
    chars, start = [], 0.0
    for name, end in phones:
        spelt = ARPABET.get(name, "?")
        step = (end - start) / len(spelt)
        for k, c in enumerate(spelt):
            chars.append((c, start + k * step, start + (k + 1) * step))
        start = end
    return chars


def _kind(c: str) -> str:
    if c in BREAKS or c == PAUSE:
        return "break"
    if c == LENGTH:
        return "length"
    return "vowel" if c in VOWELS else "consonant"


def _cost(a: str, b: str) -> float:
    ka, kb = _kind(a), _kind(b)
    if a == b or (ka == kb == "break"):
        return 0.0
    if "break" in (ka, kb):
        return 9.0
    if ka == kb or {ka, kb} == {"length", "vowel"}:
        return 0.5 if ka == "vowel" or kb == "vowel" else 0.7
    return 1.0


def align(ours: list[str], theirs: list[str]) -> list[tuple[int | None, int | None]]:
    """Edit-distance alignment of our characters with flite's: (our index or None, their index or None) pairs."""
    n, m = len(ours), len(theirs)
    gap_a = [GAP_BREAK if _kind(c) == "break" else GAP_PHONE for c in ours]
    gap_b = [GAP_BREAK if _kind(c) == "break" else GAP_PHONE for c in theirs]
    d = np.zeros((n + 1, m + 1))
    d[1:, 0] = np.cumsum(gap_a)
    d[0, 1:] = np.cumsum(gap_b)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j - 1] + _cost(ours[i - 1], theirs[j - 1]), d[i - 1, j] + gap_a[i - 1],
                          d[i, j - 1] + gap_b[j - 1])
    pairs, i, j = [], n, m
    while i or j:
        if i and j and np.isclose(d[i, j], d[i - 1, j - 1] + _cost(ours[i - 1], theirs[j - 1])):
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i and np.isclose(d[i, j], d[i - 1, j] + gap_a[i - 1]):
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    return pairs[::-1]


def frame_labels(phonemes: list[str], phones: list[tuple[str, float]], index: dict[str, int],
                 n_frames: int) -> tuple[list[int], float]:
    """Our phonemes and flite's timed phones -> one speech id per 40 ms frame (``n_frames`` of them), and the share
    of our characters aligned with a flite character spelt the same."""
    units: list[tuple[str, int]] = []
    stress = 0
    for sym in ["^", *phonemes, "$"]:
        if sym in STRESS:
            stress = STRESS[sym]
            continue
        if sym in BREAKS:
            stress = 0
        units.append((sym, 0 if sym in BREAKS else stress))
    theirs = flite_chars(phones)
    if theirs and theirs[0][0] == PAUSE:
        theirs[0] = ("^", *theirs[0][1:])
    if len(theirs) > 1 and theirs[-1][0] == PAUSE:
        theirs[-1] = ("$", *theirs[-1][1:])
    seconds = [0.0] * len(units)
    same = 0
    last = None
    for a, b in align([u[0] for u in units], [c[0] for c in theirs]):
        if b is None:
            continue
        span = theirs[b][2] - theirs[b][1]
        if a is not None:
            seconds[a] += span
            last = a
            same += units[a][0] == theirs[b][0] and units[a][0] not in BREAKS
        else:  # flite time no character of ours is aligned with: the character before it (or the first)
            seconds[last if last is not None else 0] += span
    labels = labels_from_ends(units, np.cumsum(seconds) * TOKEN_RATE, index)
    labels = labels[:n_frames] + [labels[-1]] * max(0, n_frames - len(labels))
    return labels, same / max(1, sum(u[0] not in BREAKS for u in units))


def render(job: dict) -> dict | None:
    from cadenza.text.phonemes import phonemize

    wav = Path(job["path"])
    labels_path = wav.with_suffix(".json")
    if wav.is_file() and labels_path.is_file():
        return json.loads(labels_path.read_text())
    index = {s: i for i, s in enumerate(job["symbols"])}
    phonemes = phonemize(job["text"])
    if not phonemes or any(p not in index for p in phonemes):
        return None
    wav.parent.mkdir(parents=True, exist_ok=True)
    tmp = wav.with_suffix(".tmp.wav")
    phones = flite_phones(job["voice"], job["text"], tmp)
    audio, sr = sf.read(tmp, dtype="float32")
    n_frames = len(audio) * TOKEN_RATE // sr
    if n_frames < 5 or not phones:
        tmp.unlink(missing_ok=True)
        return None
    labels, agreement = frame_labels(phonemes, phones, index, n_frames)
    tmp.replace(wav)
    row = {"id": job["id"], "text": job["text"], "voice": job["voice"], "seconds": round(len(audio) / sr, 3),
           "agreement": round(agreement, 3), "text_ids": [index[p] for p in phonemes], "speech_tokens": labels}
    labels_path.write_text(json.dumps(row))
    return row


def build(out: Path, sentences: Path, voices: list[str], per_voice: int, workers: int, seed: int,
          symbols: list[str], with_corpus: Path | None) -> None:
    texts = [json.loads(line)["text"] for line in sentences.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(seed)
    jobs = []
    for voice in voices:
        for k, text in enumerate(rng.sample(texts, min(per_voice, len(texts)))):
            uid = f"flite_{voice}_{k:05d}"
            jobs.append({"id": uid, "voice": voice, "text": text, "symbols": symbols,
                         "path": str(out / "wavs" / voice / f"{uid}.wav")})
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = [r for r in pool.map(render, jobs, chunksize=32) if r is not None]
    total = write_corpus(out, rows, with_corpus)
    agreement = {v: round(float(np.mean([r["agreement"] for r in rows if r["voice"] == v] or [0])), 3)
                 for v in voices}
    (out / "alignment.json").write_text(json.dumps({"utterances": len(rows), "same_spelling": agreement}, indent=1))
    print(f"{len(rows)} flite utterances, {total} rows in all; same spelling: {agreement}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sentences", type=Path, required=True, help="a manifest.jsonl whose texts are read")
    p.add_argument("--voices", nargs="+", default=["slt", "rms", "kal16"])
    p.add_argument("--per-voice", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phonemes", type=Path, default=None,
                   help="phonemes.json (default: the built-in cadenza-tiny's)")
    p.add_argument("--with-corpus", type=Path, default=None, help="a corpus folder whose rows are added")
    a = p.parse_args()
    if shutil.which("flite") is None:
        raise SystemExit("flite_corpus.py needs Debian's flite (apt-get install flite, or recipes/tiny/setup_tools.sh)")
    if a.phonemes is None:
        from cadenza.builtin import builtin_model_dir

        a.phonemes = builtin_model_dir() / "CosyVoice-BlankEN" / "phonemes.json"
    symbols = json.loads(a.phonemes.read_text(encoding="utf-8"))["symbols"]
    a.out.mkdir(parents=True, exist_ok=True)
    build(a.out, a.sentences, a.voices, a.per_voice, a.workers, a.seed, symbols, a.with_corpus)


if __name__ == "__main__":
    main()
