"""Which frequency band makes the vocoder sound unnatural: the MOS proxy of band-swapped copy synthesis.

    python recipes/tiny/vocoder_bands.py --wavs WORK/corpus_v3/wavs/joe [--model DIR] [--limit 20]
        [--splits 2000,4000,6000] [--magnitude-phase]

Each teacher clip is resynthesised by the model's HiFT from its own mel (copy synthesis: the acoustic model plays no
part), then cut at each split frequency with a zero-phase low-pass (a raised-cosine step of +-10 % around it, applied to the
whole clip's spectrum) and put back together
with the other half from the other signal: the teacher below the split and the vocoder above it, and the reverse.
Naturalness is DistillMOS's MOS proxy (``cadenza.evaluation.naturalness``, docs/evaluation.md). A band the vocoder
renders as well as the teacher costs nothing when swapped in; the band that holds the vocoder's flaws moves the score
most. Low-passing alone is no test: the proxy rates clean narrowband speech above wideband speech with artefacts
(the vocoder's own output gains when its top is cut, the teacher's loses), so both halves are always present here.

``--magnitude-phase`` also asks which half of the vocoder's band is flawed, its magnitude or its phase: below each
split the short-time spectrum (2048-point Hann frames, hop 256) takes its magnitude from one signal and its phase
from the other, the teacher's spectrum above it, and the overlap-add puts the waveform back. Such a spectrum is not
quite one that any signal has, so both swaps carry the same resynthesis artefacts; compare them with each other and
with the vocoder's whole low band under the teacher's top (``vocoder below``).

Prints one line per signal: the mean score over the clips. docs/cadenza-tiny.md ("Quality") has the figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.resample import resample
from cadenza.evaluation.naturalness import load_naturalness_model, naturalness
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights

SHIPPED = Path(__file__).resolve().parents[2] / "src/cadenza/assets/cadenza-tiny"


def low_pass(wav: np.ndarray, sample_rate: int, cutoff: float) -> np.ndarray:
    """Zero-phase low-pass of ``wav [samples]``: its spectrum times a gain that falls from 1 to 0 as a raised cosine
    between 0.9 and 1.1 x ``cutoff`` (the high band is ``wav`` minus this, so the two halves add back exactly)."""
    freqs = np.fft.rfftfreq(len(wav), 1.0 / sample_rate)
    ramp = np.clip((freqs - 0.9 * cutoff) / (0.2 * cutoff), 0.0, 1.0)
    gain = 0.5 * (1.0 + np.cos(np.pi * ramp))
    return np.fft.irfft(np.fft.rfft(wav) * gain, n=len(wav))


def band_swaps(teacher: np.ndarray, vocoder: np.ndarray, sample_rate: int, splits: list[float]) -> dict[str, np.ndarray]:
    """The teacher, the vocoder and, per split frequency, each one's low band under the other's high band (all
    ``[samples]``, cut to the shorter of the two)."""
    n = min(len(teacher), len(vocoder))
    teacher, vocoder = teacher[:n].astype(np.float64), vocoder[:n].astype(np.float64)
    out = {"teacher": teacher, "vocoder": vocoder}
    for f in splits:
        t_low, v_low = low_pass(teacher, sample_rate, f), low_pass(vocoder, sample_rate, f)
        out[f"teacher below {f:.0f} Hz, vocoder above"] = t_low + (vocoder - v_low)
        out[f"vocoder below {f:.0f} Hz, teacher above"] = v_low + (teacher - t_low)
    return out


def magnitude_phase_swaps(teacher: np.ndarray, vocoder: np.ndarray, sample_rate: int, splits: list[float],
                          n_fft: int = 2048, hop: int = 256) -> dict[str, np.ndarray]:
    """Per split frequency, the teacher's short-time spectrum with its bins below the split replaced by the vocoder's
    magnitude under the teacher's phase, and by the teacher's magnitude under the vocoder's phase (all
    ``[samples]``, cut to the shorter of the two; bins below the split are those whose centre frequency is)."""
    n = min(len(teacher), len(vocoder))
    window = torch.hann_window(n_fft, dtype=torch.float64)

    def stft(x: np.ndarray) -> torch.Tensor:
        return torch.stft(torch.from_numpy(x[:n].astype(np.float64)), n_fft, hop, window=window, return_complex=True)

    def istft(spec: torch.Tensor) -> np.ndarray:
        return torch.istft(spec, n_fft, hop, window=window, length=n).numpy()

    t_spec, v_spec = stft(teacher), stft(vocoder)
    t_phase, v_phase = (torch.polar(torch.ones_like(spec.real), spec.angle()) for spec in (t_spec, v_spec))
    freqs = torch.fft.rfftfreq(n_fft, 1.0 / sample_rate, dtype=torch.float64)
    out = {}
    for f in splits:
        low = (freqs < f).to(torch.float64)[:, None]
        out[f"below {f:.0f} Hz vocoder magnitude, teacher phase"] = istft(
            low * v_spec.abs() * t_phase + (1 - low) * t_spec)
        out[f"below {f:.0f} Hz teacher magnitude, vocoder phase"] = istft(
            low * t_spec.abs() * v_phase + (1 - low) * t_spec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wavs", type=Path, required=True, help="a folder of teacher renderings (any sample rate)")
    ap.add_argument("--model", type=Path, default=SHIPPED, help="the model folder whose hift.pt is judged")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--splits", default="2000,4000,6000", help="split frequencies in Hz, comma-separated")
    ap.add_argument("--magnitude-phase", action="store_true",
                    help="also swap the magnitude and the phase below each split (see the module's docstring)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits = [float(s) for s in args.splits.split(",")]
    model = load_cosyvoice2_weights(inspect_directory(args.model))
    hift, sr = model.hift.eval(), model.config.hift.sampling_rate
    judge = load_naturalness_model()
    files = sorted(args.wavs.glob("*.wav"))[: args.limit]
    if not files:
        raise SystemExit(f"no .wav files in {args.wavs}")
    scores: dict[str, list[float]] = {}
    for path in files:
        audio, rate = sf.read(path, dtype="float32")
        wav = resample(torch.from_numpy(audio), rate, sr)
        with torch.inference_mode():
            out, _ = hift.inference(flow_prompt_mel(wav[None], model.config.mel),
                                    generator=torch.Generator().manual_seed(0))
        teacher, vocoder = wav.numpy(), out.reshape(-1).numpy()
        signals = band_swaps(teacher, vocoder, sr, splits)
        if args.magnitude_phase:
            signals.update(magnitude_phase_swaps(teacher, vocoder, sr, splits))
        for name, signal in signals.items():
            scores.setdefault(name, []).append(naturalness(signal.astype(np.float32), sr, model=judge))
    print(f"{len(files)} clips of {args.wavs}, vocoder of {args.model}; naturalness (MOS proxy), mean ± its "
          f"standard error:")
    for name, values in scores.items():
        print(f"  {np.mean(values):.3f} ± {np.std(values) / np.sqrt(len(values)):.3f}  {name}")


if __name__ == "__main__":
    main()
