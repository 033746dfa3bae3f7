"""The pitch of synthesized speech: YIN, searching only near what the model's own vocoder hears.

YIN alone reads a period from the waveform and needs clear periodicity. cadenza-tiny's voice (joe, ~90 Hz) is still
partly breathy, and on it YIN's median moved between ~100 and ~200 Hz with its search floor and threshold and with
small changes of the audio (octave errors: where the fundamental is weak, two periods or half a period match
better). HiFT's f0 predictor, trained on this voice's mels against its f0, reads them smoothly (87 Hz on the teacher's
own recordings, YIN 90 Hz) but not exactly: on the teacher time-scaled to double speed by WSOLA it reads 3 % lower,
where YIN reads the same period. So ``guided_f0`` lets the predictor pick the octave (the median of what it reads,
``vocoder_f0``) and YIN measure the period within [0.7, 1.4] x that: on the teacher at speed 1 and 2 it reads 89.5 Hz
both; on cadenza-tiny's streamed and whole output at speed 1 and 2, 99.8-100.0 Hz. The speed checks (tests,
benchmarks/speed_streaming.py) read the pitch of CosyVoice 2 models this way.
"""

from __future__ import annotations

import numpy as np
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.pitch import yin_f0
from cadenza.audio.resample import resample


@torch.inference_mode()
def vocoder_f0(audio: np.ndarray | torch.Tensor, sample_rate: int, model, floor_db: float = 30.0) -> torch.Tensor:
    """f0 in Hz of the voiced, audible mel frames of mono ``audio [samples]`` as ``model``'s HiFT f0 predictor
    reads them (a CosyVoice 2 model: ``model.hift``, ``model.config``).

    A frame counts when the predictor calls it voiced (above the harmonic source's own voicing threshold) and its
    mel energy is within ``floor_db`` of the loudest frame's (silences and breaths are left out).

    Returns:
        ``[voiced frames]`` float32 (empty when nothing is voiced).
    """
    wav = torch.as_tensor(np.ascontiguousarray(audio, dtype=np.float32)).reshape(-1)
    rate = model.config.hift.sampling_rate
    if sample_rate != rate:
        wav = resample(wav, sample_rate, rate)
    mel = flow_prompt_mel(wav[None], model.config.mel)  # [1, 80, frames], log mel
    f0 = model.hift.f0_predictor(mel.to(next(model.hift.parameters()).device))[0].float().cpu()
    energy = mel[0].exp().sum(0)
    audible = energy > energy.max() * 10 ** (-floor_db / 10)
    n = min(f0.numel(), audible.numel())
    keep = audible[:n] & (f0[:n] > model.config.hift.nsf_voiced_threshold)
    return f0[:n][keep]


def guided_f0_track(audio: np.ndarray | torch.Tensor, sample_rate: int, model, threshold: float = 0.45,
                    frame_s: float = 0.01) -> torch.Tensor:
    """f0 in Hz of every ``frame_s`` frame of mono ``audio [samples]`` (0 = unvoiced; frame *t* centred on
    ``(t + 0.5) * frame_s`` seconds) by YIN searching [0.7, 1.4] x the median of ``vocoder_f0`` (the octave as
    ``model``'s vocoder reads it). ``threshold``: YIN's (permissive by default: the search range already excludes
    the octave errors a permissive threshold invites).

    Returns:
        ``[frames]`` float32 (all zero when the vocoder hears nothing voiced).
    """
    wav = torch.as_tensor(np.ascontiguousarray(audio, dtype=np.float32)).reshape(-1)
    hop = max(1, int(round(frame_s * sample_rate)))
    heard = vocoder_f0(wav, sample_rate, model)
    if heard.numel() == 0:
        return wav.new_zeros(wav.shape[0] // hop)
    centre = float(heard.median())
    return yin_f0(wav, sample_rate, hop, fmin=0.7 * centre, fmax=1.4 * centre, threshold=threshold)


def guided_f0(audio: np.ndarray | torch.Tensor, sample_rate: int, model, threshold: float = 0.45,
              frame_s: float = 0.01) -> torch.Tensor:
    """f0 in Hz of the voiced frames of ``guided_f0_track`` (the same arguments).

    Returns:
        ``[voiced frames]`` float32 (empty when the vocoder hears nothing voiced).
    """
    f0 = guided_f0_track(audio, sample_rate, model, threshold, frame_s)
    return f0[f0 > 0]


def aligned_f0_ratios(changed: np.ndarray | torch.Tensor, original: np.ndarray | torch.Tensor, rate: float,
                      sample_rate: int, model, frame_s: float = 0.01) -> torch.Tensor:
    """``changed``'s f0 over ``original``'s at the same point of the utterance, frame by frame (``guided_f0_track``
    of each; both mono ``[samples]`` at ``sample_rate``).

    ``rate``: ``original``'s duration over ``changed``'s (2 for twice as fast, by any time-scale or the flow's own
    rate; 1.25 for played 1.25x faster). Frame *j* of ``changed`` is compared with frame
    ``round((j + 0.5) * rate - 0.5)`` of ``original``, where both are voiced. A time-scale that keeps the pitch reads
    ~1 here frame by frame; the median over each signal's own voiced frames (``guided_f0``) also moves with which
    frames each happens to voice: on 2 s sentences of cadenza-tiny by up to ±7 % (docs/controls.md, "Reading the
    pitch").

    Returns:
        ``[frames voiced in both]`` float32.
    """
    return track_ratios(guided_f0_track(changed, sample_rate, model, frame_s=frame_s),
                        guided_f0_track(original, sample_rate, model, frame_s=frame_s), rate)


def track_ratios(changed: torch.Tensor, original: torch.Tensor, rate: float) -> torch.Tensor:
    """Frame *j* of the f0 track ``changed [frames]`` over frame ``round((j + 0.5) * rate - 0.5)`` of ``original
    [frames]`` (0 = unvoiced; frames of one length), where both are voiced (``aligned_f0_ratios``).

    Returns:
        ``[frames voiced in both]`` float32.
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    at = ((torch.arange(changed.numel(), dtype=torch.float64) + 0.5) * rate - 0.5).round().long()
    inside = at < original.numel()
    ours, theirs = changed[inside], original[at[inside]]
    both = (ours > 0) & (theirs > 0)
    return ours[both] / theirs[both]
