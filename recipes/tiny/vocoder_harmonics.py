"""Does a model's vocoder voice the default speaker? Copy synthesis of the teacher's renderings, measured where breathiness
lives (docs/cadenza-tiny.md, "Quality"):

* the f0 predictor against YIN on the teacher's voiced frames (median relative error, share predicted unvoiced);
* the harmonic source's mix (``m_source.l_linear``: a vocoder that learnt to silence its source has ~0 there);
* harmonic prominence, 60-700 Hz and 700-3000 Hz: the level at k x f0 over the mean level half-way to the next
  harmonics (4096-point spectra on the teacher's voiced frames, f0 from YIN), for the teacher, the vocoder's output and
  its source signal; ``--oracle`` drives the source with the teacher's f0 instead of the predicted one, which tells
  a decoder that ignores its source from an f0 predictor that misleads it;
* what the decoder does with its source: the output's change (dB, against the output's energy) when the source is
  zeroed (a decoder that ignores its source barely changes);
* whether the output's pitch follows the source: the share of frames voiced in both whose output pitch (YIN, 40-400
  Hz) is within 5 % of the source's f0, and the median ratio; ``--source-scale 1.25`` drives the source at 1.25 x
  the f0 with the same mel, so a decoder that takes its pitch from the source moves with it and one that voices from
  the mel (or its 50 Hz frames) does not.

``python recipes/tiny/vocoder_harmonics.py --work WORK [--model DIR] [--limit 10] [--oracle] [--source-scale K]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.pitch import yin_f0
from cadenza.audio.resample import resample
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights

HOP = 480
FFT = 4096


def prominence(wav: np.ndarray, sr: int, f0: np.ndarray, bands=((60, 700), (700, 3000))) -> list[float]:
    """Mean harmonic prominence in dB per band over the frames with f0 > 0 (frame t centred on sample 480 t + 240)."""
    window = np.hanning(FFT)
    values: list[list[float]] = [[] for _ in bands]
    bin_hz = sr / FFT
    for t, pitch in enumerate(f0):
        centre = HOP * t + HOP // 2
        if pitch <= 0 or centre < FFT // 2 or centre + FFT // 2 > len(wav):
            continue
        spec = np.abs(np.fft.rfft(wav[centre - FFT // 2: centre + FFT // 2] * window)) + 1e-9
        for k in range(1, 60):
            f = k * pitch
            if f + pitch / 2 >= bands[-1][1]:
                break
            on, below, above = (spec[int(round(x / bin_hz))] for x in (f, f - pitch / 2, f + pitch / 2))
            for band, (lo, hi) in enumerate(bands):
                if lo <= f < hi:
                    values[band].append(20 * np.log10(on / (0.5 * (below + above))))
    return [float(np.mean(v)) if v else float("nan") for v in values]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="the recipe's WORK folder (its corpus_v2 renderings)")
    ap.add_argument("--model", type=Path, default=Path(__file__).resolve().parents[2] / "src/cadenza/assets/cadenza-tiny")
    ap.add_argument("--speaker", default="joe")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--oracle", action="store_true", help="drive the source with the teacher's f0 (YIN)")
    ap.add_argument("--source-scale", type=float, default=1.0, help="multiply the source's f0 by this")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_cosyvoice2_weights(inspect_directory(args.model))
    hift, sr = model.hift.eval(), model.config.hift.sampling_rate
    mix = hift.m_source.l_linear
    print(f"source mix: weights {[round(float(w), 4) for w in mix.weight[0]]}, bias {float(mix.bias[0]):.4f}")
    files = sorted((args.work / "corpus_v2" / "wavs" / args.speaker).glob("*.wav"))[: args.limit]
    errors, unvoiced, rows, follows, ratios = [], [], [], [], []
    for path in files:
        audio, rate = sf.read(path, dtype="float32")
        wav = resample(torch.from_numpy(audio), rate, sr)
        with torch.inference_mode():
            mel = flow_prompt_mel(wav[None], model.config.mel)
            f0_pred = hift.f0_predictor(mel)
            f0_true = yin_f0(wav, sr, HOP, n_frames=mel.shape[2], fmin=60, fmax=400)
            f0_source = (f0_true[None] if args.oracle else f0_pred) * args.source_scale
            source = hift.source_from_f0(f0_source, generator=torch.Generator().manual_seed(0))
            out = hift.decode(mel, source)[0].numpy()
            silent = hift.decode(mel, torch.zeros_like(source))[0].numpy()
        heard = yin_f0(torch.from_numpy(out), sr, HOP, n_frames=mel.shape[2], fmin=40, fmax=400, threshold=0.3).numpy()
        driven = f0_source[0].numpy()
        both_voiced = (heard > 0) & (driven > 10)
        if both_voiced.any():
            follows.append(float(np.mean(np.abs(heard[both_voiced] / driven[both_voiced] - 1) < 0.05)))
            ratios.append(float(np.median(heard[both_voiced] / driven[both_voiced])))
        pred, true = f0_pred[0].numpy(), f0_true.numpy()
        voiced = true > 0
        both = voiced & (pred > 10)
        errors += list(np.abs(pred[both] / true[both] - 1))
        unvoiced.append(float(np.mean(pred[voiced] <= 10)) if voiced.any() else 0.0)
        n = min(len(out), wav.numel())
        change = 10 * np.log10(np.sum((silent - out) ** 2) / max(float(np.sum(out ** 2)), 1e-12) + 1e-12)
        rows.append({"file": path.name, "teacher": prominence(wav.numpy()[:n], sr, true),
                     "output": prominence(out[:n], sr, true), "source": prominence(source[0, 0].numpy()[:n], sr, true),
                     "zeroed": float(change)})
        r = rows[-1]
        print(f"{path.name}: prominence 60-700 / 700-3000 Hz (dB)  teacher {r['teacher'][0]:5.1f} / {r['teacher'][1]:4.1f}"
              f"  output {r['output'][0]:5.1f} / {r['output'][1]:4.1f}  source {r['source'][0]:5.1f} / {r['source'][1]:4.1f}"
              f"  source zeroed: output changes {r['zeroed']:5.1f} dB", flush=True)
    summary = {key: float(np.mean([r[key][0] for r in rows])) for key in ("teacher", "output", "source")}
    print(f"f0 predictor: median relative error {np.median(errors):.3f}, teacher-voiced frames predicted unvoiced "
          f"{np.mean(unvoiced):.2f}; mean prominence 60-700 Hz: {json.dumps({k: round(v, 1) for k, v in summary.items()})}; "
          f"source zeroed: output changes {np.mean([r['zeroed'] for r in rows]):.1f} dB"
          f"{' (source driven by the teacher f0)' if args.oracle else ''}")
    print(f"output pitch within 5 % of the source's f0 (x {args.source_scale}) on frames voiced in both: "
          f"{np.mean(follows):.2f}; median output / source pitch {np.mean(ratios):.2f}")


if __name__ == "__main__":
    main()
