"""What the provenance watermark costs and survives (docs/provenance.md): SNR, detection and payload after lossy
codecs, resampling, crops and noise, and the false-positive rate on unmarked audio.

Run: ``python benchmarks/watermark_robustness.py [--crops 20] [--keys 8] [--builtin 24]`` (about 2.5 minutes on 2
CPU cores).
Needs the shared speech recordings (``$CADENZA_SHARED_AUDIO``, default ``../shared/audio``) and PyAV (the
``server`` extra) for mp3/opus. Prints Markdown tables.

Marked audio: each recording, resampled to 24 kHz (CosyVoice 2) and 48 kHz (VoxCPM 2), marked with a random
payload. Each condition is measured on the whole clips and on random crops (taken after the transform, so codec
delay and resampling land anywhere in the cycle). Unmarked audio: the recordings at their own rates cut into
0.5 / 1 / 2 s windows every 0.1 s, the same after mp3, and synthetic signals (silence, noise, tones, chirps,
clicks), each read with several keys (each key is an independent test).

The built-in model's own speech (``--builtin N``, 0 to skip): N everyday sentences rendered by cadenza-tiny (seed
3), marked as the API marks them, read whole and in 2 s crops; unmarked, they join the false-positive windows. A
small vocoder's output is not real speech (cadenza-tiny's repeats partly every 20 ms: docs/provenance.md), so a
change of vocoder or detector is checked here too.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from cadenza.engine.precision import detect_cpu
from cadenza.provenance import Watermark
from cadenza.provenance.channels import add_white_noise, codec_roundtrip, random_crop, resample_np
from cadenza.provenance.keys import DEFAULT_KEY

AUDIO_DIR = Path(os.environ.get("CADENZA_SHARED_AUDIO") or Path(__file__).resolve().parents[1] / "../shared/audio")
FILES = ("zh_prompt_24k.wav", "zh_longform_22k.wav", "en_stereo_44k.wav", "zh_lively_48k.wav")
KEY = b"benchmark key"
SENTENCES = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "lists" / "everyday_test.txt"


def load(name: str) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(AUDIO_DIR / name, dtype="float32")
    return (audio.mean(axis=1) if audio.ndim == 2 else audio).astype(np.float32), rate


def conditions(rng: np.random.Generator):
    """name -> function(audio, rate) -> (audio, rate)."""
    return {
        "clean": lambda a, r: (a, r),
        "mp3 64 kbit/s": lambda a, r: codec_roundtrip(a, r, "mp3", 64_000),
        "opus 64 kbit/s": lambda a, r: codec_roundtrip(a, r, "opus", 64_000),
        "resampled to 16 kHz": lambda a, r: (resample_np(a, r, 16_000), 16_000),
        "white noise, 20 dB SNR": lambda a, r: (add_white_noise(a, 20.0, rng), r),
        "mp3 64k + 16 kHz + noise 20 dB": lambda a, r: (add_white_noise(
            resample_np(*codec_roundtrip(a, r, "mp3", 64_000), 16_000), 20.0, rng), 16_000),
    }


def bit_errors(a: int, b: int) -> int:
    return bin(a ^ b).count("1")


def robustness(args, rng: np.random.Generator) -> None:
    marked = []  # (rate, payload, audio)
    snrs = {}
    for rate in (24_000, 48_000):
        wm = Watermark(KEY, rate)
        for name in FILES:
            audio, native = load(name)
            x = resample_np(audio, native, rate)
            payload = int(rng.integers(0, 2**32))
            start = time.perf_counter()
            y = wm.embed(x, payload)
            elapsed = time.perf_counter() - start
            noise = (y.astype(np.float64) - x) ** 2
            snrs[(rate, name)] = (10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum(noise)),
                                  x.size / rate / elapsed)
            marked.append((rate, payload, y))
    print("## Mark level (SNR = audio power / mark power over the whole clip)\n")
    print("| clip | 24 kHz SNR | 48 kHz SNR | embed speed (x real time, 24 / 48 kHz) |")
    print("|---|---|---|---|")
    for name in FILES:
        s24, v24 = snrs[(24_000, name)]
        s48, v48 = snrs[(48_000, name)]
        print(f"| {name} | {s24:.1f} dB | {s48:.1f} dB | {v24:.0f} / {v48:.0f} |")
    print()

    detector = Watermark(KEY, 24_000)  # detection does not depend on the embedding rate
    print(f"## Detection ({args.crops} random crops per clip and rate for each crop length; "
          f"{len(marked)} whole clips)\n")
    lengths = (0.5, 1.0, 2.0)
    header = " | ".join(f"{s:g} s crops: found / payload / bits" for s in lengths)
    print(f"| condition | whole clips: found / payload | {header} |")
    print("|---|---|" + "---|" * len(lengths))
    wrong = reads = 0  # payloads read (CRC matched) that are not the one embedded
    for cname, transform in conditions(rng).items():
        whole_found = whole_payload = 0
        crop_stats = {s: [0, 0, 0, 0] for s in lengths}  # found, payload, bit errors, trials
        for _, payload, y in marked:
            z, zr = transform(y, _)
            d = detector.detect(z, zr)
            whole_found += d.found
            whole_payload += d.payload == payload
            for seconds in lengths:
                for _i in range(args.crops):
                    c = detector.detect(random_crop(z, int(seconds * zr), rng), zr)
                    st = crop_stats[seconds]
                    st[0] += c.found
                    st[1] += c.payload == payload
                    st[2] += bit_errors(c.raw_payload, payload)
                    reads += c.payload is not None
                    wrong += c.payload is not None and c.payload != payload
                    st[3] += 1
        cells = []
        for seconds in lengths:
            found, pay, errors, n = crop_stats[seconds]
            cells.append(f"{found / n:.1%} / {pay / n:.1%} / {1 - errors / (32 * n):.1%}")
        print(f"| {cname} | {whole_found}/{len(marked)} / {whole_payload}/{len(marked)} | {' | '.join(cells)} |")
    print("\nfound: detection rate; payload: payload read with a matching CRC; bits: payload bits right "
          "(hard decisions, CRC or not).")
    print(f"wrong payloads (read with a matching CRC, not the one embedded): {wrong} of {reads} crop reads\n")


def builtin_speech(count: int) -> tuple[int, list[np.ndarray]]:
    """``count`` everyday sentences spoken by the built-in model, unmarked: (rate, [float32 [n]])."""
    import cadenza

    lines = [line.strip() for line in SENTENCES.read_text().splitlines() if line.strip()][:count]
    with cadenza.load(watermark=False) as model:
        return model.sample_rate, [model.synthesize(text, seed=3).samples for text in lines]


def builtin_detection(args, rate: int, clips: list[np.ndarray], rng: np.random.Generator) -> None:
    wm = Watermark(DEFAULT_KEY, rate)
    found = payload_ok = crop_found = crop_payload = crops = 0
    for clip in clips:
        payload = int(rng.integers(0, 2**32))
        marked = wm.embed(clip, payload)
        d = wm.detect(marked, rate)
        found += d.found
        payload_ok += d.payload == payload
        for _ in range(args.crops if marked.size > 2 * rate else 0):
            c = wm.detect(random_crop(marked, 2 * rate, rng), rate)
            crop_found += c.found
            crop_payload += c.payload == payload
            crops += 1
    seconds = [clip.size / rate for clip in clips]
    print(f"## The built-in model's speech ({len(clips)} sentences, {min(seconds):.1f}-{max(seconds):.1f} s, "
          f"clean)\n")
    print("| whole clips: found / payload | 2 s crops: found / payload |")
    print("|---|---|")
    crop_cell = f"{crop_found / crops:.1%} / {crop_payload / crops:.1%}" if crops else "-"
    print(f"| {found}/{len(clips)} / {payload_ok}/{len(clips)} | {crop_cell} |\n")


def synthetic(rate: int, seconds: float, rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """Unmarked non-speech signals."""
    n = int(rate * seconds)
    t = np.arange(n) / rate
    out = [("silence", np.zeros(n)), ("dither", rng.standard_normal(n) * 1e-5)]
    for level in (0.01, 0.1, 0.3):
        out.append((f"white {level}", rng.standard_normal(n) * level))
        pink = np.fft.irfft(np.fft.rfft(rng.standard_normal(n)) / np.sqrt(np.arange(n // 2 + 1) + 1.0), n=n)
        out.append((f"pink {level}", pink / np.std(pink) * level))
    for f in (100, 440, 1000, 1234.5, 2500, 4000, 6000, 6999):
        out.append((f"tone {f}", 0.5 * np.sin(2 * np.pi * f * t)))
        out.append((f"square {f}", 0.3 * np.sign(np.sin(2 * np.pi * f * t))))
    out.append(("chirp", 0.5 * np.sin(2 * np.pi * (50 * t + 7000 * t**2 / (2 * seconds)))))
    clicks = np.zeros(n)
    clicks[:: rate // 10] = 0.9
    out.append(("clicks 10/s", clicks))
    harmonics = sum(np.sin(2 * np.pi * 125 * k * t + k) / k for k in range(1, 60))
    out.append(("buzz 125 Hz", 0.2 * harmonics))
    return [(name, x.astype(np.float32)) for name, x in out]


def false_positives(args, rng: np.random.Generator, extra: list[tuple[str, np.ndarray, int]] = ()) -> None:
    keys = [Watermark(f"fp key {i}".encode(), 24_000) for i in range(args.keys)]
    scores, names, hits, payloads = [], [], 0, 0

    def check(name: str, audio: np.ndarray, rate: int) -> None:
        nonlocal hits, payloads
        for wm in keys:
            d = wm.detect(audio, rate)
            scores.append(d.score)
            names.append(name)
            hits += d.found
            payloads += d.payload is not None

    start = time.perf_counter()
    windows = 0
    for name in FILES:
        audio, rate = load(name)
        sources = [(name, audio, rate)]
        if args.codec_windows:
            coded, coded_rate = codec_roundtrip(audio, rate, "mp3", 64_000)
            sources.append((f"{name} mp3", coded, coded_rate))
        for label, x, r in sources:
            for seconds in (0.5, 1.0, 2.0):
                length, step = int(seconds * r), int(0.1 * r)
                for begin in range(0, x.size - length + 1, step):
                    check(f"{label} {seconds:g} s", x[begin: begin + length], r)
                    windows += 1
            check(f"{label} whole", x, r)
            windows += 1
    for name, x, r in extra:
        check(name, x, r)
        windows += 1
    for rate in (16_000, 24_000, 44_100, 48_000):
        for seconds in (0.5, 3.0):
            for name, x in synthetic(rate, seconds, rng):
                check(f"{name} {rate} {seconds:g} s", x, rate)
                windows += 1
    elapsed = time.perf_counter() - start
    scores = np.asarray(scores)
    worst = int(np.argmax(scores))
    trials = scores.size
    print(f"## False positives on unmarked audio ({windows} windows x {args.keys} keys = {trials} detections, "
          f"{elapsed:.0f} s)\n")
    print("| detections | found | payload with CRC | max score (where) | 99.9th pct score | 95% upper bound on FP rate |")
    print("|---|---|---|---|---|---|")
    bound = poisson_upper(hits) / trials
    print(f"| {trials} | {hits} | {payloads} | {scores[worst]:.2f} ({names[worst]}) | "
          f"{np.quantile(scores, 0.999):.2f} | {bound:.1e} |")
    print(f"\nthreshold: found at score >= {keys[0].threshold:g}, or >= 4.5 with a matching CRC.\n")


def poisson_upper(events: int, confidence: float = 0.95) -> float:
    """The rate lambda above which seeing <= ``events`` has probability < 1 - ``confidence`` (3.0 for none)."""
    low, high = 0.0, 10.0 + 10.0 * events
    for _ in range(100):  # bisection on the Poisson CDF, which falls with lambda
        lam = (low + high) / 2
        cdf = sum(np.exp(-lam) * lam**k / np.prod(np.arange(1, k + 1, dtype=float)) for k in range(events + 1))
        low, high = (lam, high) if cdf > 1 - confidence else (low, lam)
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crops", type=int, default=20, help="random crops per clip, rate and length")
    parser.add_argument("--keys", type=int, default=8, help="keys each unmarked window is read with")
    parser.add_argument("--no-codec-windows", dest="codec_windows", action="store_false",
                        help="skip the unmarked windows after mp3")
    parser.add_argument("--builtin", type=int, default=24,
                        help="sentences of the built-in model's speech to mark and read (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not all((AUDIO_DIR / name).is_file() for name in FILES):
        raise SystemExit(f"shared speech recordings not found in {AUDIO_DIR} (set CADENZA_SHARED_AUDIO)")
    rng = np.random.default_rng(args.seed)
    print(f"CPU: {detect_cpu().describe()}\n")
    start = time.perf_counter()
    robustness(args, rng)
    extra = []
    if args.builtin:
        rate, clips = builtin_speech(args.builtin)
        builtin_detection(args, rate, clips, rng)
        extra = [(f"built-in model sentence {i}", clip, rate) for i, clip in enumerate(clips)]
    false_positives(args, rng, extra)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
