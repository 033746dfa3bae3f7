"""Kaldi log mel filterbank features, the CAM++ speaker encoder's input (docs/design.md, "Audio features").

Re-implements ``torchaudio.compliance.kaldi.fbank(wav, num_mel_bins=80, dither=0, sample_frequency=16000)`` with
torchaudio's other defaults (torchaudio has no release for current torch), following its op order in float32:

1. frames of 25 ms every 10 ms, ``snip_edges=True``: ``1 + (N - 400) // 160`` frames, none padded;
2. per-frame DC removal (subtract the frame mean);
3. pre-emphasis ``x[t] - 0.97 x[t-1]`` within the frame (``x[-1] := x[0]``);
4. Povey window ``hann(400, symmetric) ** 0.85``; zero-pad to the FFT size 512 (next power of two);
5. power spectrum ``|rfft|^2`` -> Kaldi triangular mel banks (20 Hz to Nyquist) -> ``log(max(x, float32 eps))``.

No dither, no energy column, no mean subtraction (``campplus_features`` adds the per-utterance mean removal the
CosyVoice frontend applies).
"""

from __future__ import annotations

import torch

from cadenza.audio.filterbanks import kaldi_mel_banks
from cadenza.errors import AudioError

PREEMPHASIS = 0.97
POVEY_EXPONENT = 0.85
LOG_FLOOR = torch.finfo(torch.float32).eps  # Kaldi floors energies at float epsilon before the log


def _next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def kaldi_fbank(
    wav: torch.Tensor,
    num_mel_bins: int = 80,
    sample_frequency: float = 16000.0,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
) -> torch.Tensor:
    """Kaldi fbank of ``wav`` (``[samples]`` or ``[1, samples]``, float; the reference passes [-1, 1] audio).

    Returns ``[frames, num_mel_bins]`` float32 with ``frames = 1 + (samples - win) // shift`` (win = 400 and
    shift = 160 at 16 kHz). ``high_freq <= 0`` means Nyquist + ``high_freq``. Raises ``AudioError`` if the audio
    is shorter than one frame.
    """
    if wav.dim() == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.dim() != 1:
        raise AudioError(f"expected mono audio [samples] or [1, samples], got shape {tuple(wav.shape)}")
    wav = wav.to(torch.float32)
    win = int(sample_frequency * frame_length_ms * 0.001)
    shift = int(sample_frequency * frame_shift_ms * 0.001)
    n_fft = _next_power_of_two(win)
    if wav.numel() < win:
        raise AudioError(f"audio too short for fbank features: {wav.numel()} samples, need at least {win}")

    frames = wav.unfold(0, win, shift)  # [frames, win]
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - PREEMPHASIS * previous
    window = torch.hann_window(win, periodic=False, dtype=torch.float32, device=wav.device).pow(POVEY_EXPONENT)
    frames = torch.nn.functional.pad(frames * window, (0, n_fft - win))  # [frames, n_fft]

    power = torch.fft.rfft(frames).abs().pow(2.0)  # [frames, n_fft // 2 + 1]
    bank = kaldi_mel_banks(num_mel_bins, n_fft, sample_frequency, low_freq, high_freq).to(wav.device)
    energies = torch.mm(power, bank.T)  # [frames, num_mel_bins]
    return torch.clamp(energies, min=LOG_FLOOR).log()


def campplus_features(wav16k: torch.Tensor, num_mel_bins: int = 80) -> torch.Tensor:
    """CAM++ input: 16 kHz Kaldi fbank minus its per-utterance mean over frames. Returns ``[1, frames, num_mel_bins]``.

    The mean removal also cancels the constant log offset between [-1, 1] and int16-scaled audio.
    """
    feats = kaldi_fbank(wav16k, num_mel_bins=num_mel_bins, sample_frequency=16000.0)
    return (feats - feats.mean(dim=0, keepdim=True)).unsqueeze(0)
