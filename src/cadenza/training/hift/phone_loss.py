"""A loss that listens for the words: a frozen phone recogniser's view of the vocoder's output against the real
speech's (docs/training_components.md, "3. HiFT vocoder GAN", "Phone loss").

The mel and spectral losses weigh every time-frequency cell alike, so a vocoder can trade a short word's onset
(a few cells) for a more natural timbre everywhere else and lose nothing by them; the listener, and an ASR, lose the
word (cadenza-tiny's pitch round did: docs/cadenza-tiny.md, "Quality"). This loss reads both waveforms with a
*frame-classifier speech tokenizer* (cadenza-tiny's own ``speech_tokenizer.safetensors``: whisper log-mel -> a
4-layer transformer -> one phone class per 40 ms frame, trained on the teacher voices) and penalises

* ``feature``: the L1 distance of its last hidden states (``[B, T, H]``), and
* ``posterior``: ``KL(p_real || p_fake)`` of its phone posteriors per frame (``[B, T, classes]``),

so what changes the recogniser's reading of the phones costs the generator, and what it ignores costs nothing.
The recogniser is frozen (no parameter gradient) and never sees the training step's discriminator. It is read at
the vocoder's own rate without resampling (``whisper_power(sample_rate=...)``); the real crop's loudest cell sets
the 8-decade floor of both log-mels, so a quiet fake is not rescaled to look louder.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.audio.filterbanks import slaney_mel_filterbank
from cadenza.audio.whisper_mel import (
    DYNAMIC_RANGE_DECADES,
    LOG10_FLOOR,
    WHISPER_N_FFT,
    WHISPER_SAMPLE_RATE,
    whisper_power,
)
from cadenza.errors import InputError
from cadenza.models.speech_tokenizer.inference import load_speech_tokenizer
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel


class PhoneLosses(NamedTuple):
    feature: torch.Tensor  # mean |h_real - h_fake| of the recogniser's last hidden states, scalar
    posterior: torch.Tensor  # mean over frames of KL(p_real || p_fake), nats, scalar


class PhoneLoss(nn.Module):
    """``(real [B, L], fake [B, L])`` waveforms at ``sample_rate`` -> :class:`PhoneLosses`.

    Args:
        recogniser: a frame-classifier :class:`SpeechTokenizerModel` (``frame_classes`` > 0); frozen here.
        sample_rate: the waveforms' rate (a multiple of 200 Hz, at least 16 kHz).
    """

    def __init__(self, recogniser: SpeechTokenizerModel, sample_rate: int) -> None:
        super().__init__()
        if not recogniser.cfg.frame_classes:
            raise InputError("the phone loss needs a frame-classifier speech tokenizer (frame_classes > 0), "
                             "not an FSQ one")
        self.recogniser = recogniser.eval().requires_grad_(False)
        self.sample_rate = sample_rate
        self.register_buffer("bank", slaney_mel_filterbank(WHISPER_SAMPLE_RATE, WHISPER_N_FFT,
                                                           recogniser.cfg.n_mels), persistent=False)

    @classmethod
    def from_path(cls, path: str | Path, sample_rate: int) -> PhoneLoss:
        """From a folder holding ``speech_tokenizer.json`` + ``.safetensors`` (e.g. a cadenza-tiny model folder)."""
        return cls(load_speech_tokenizer(Path(path).expanduser()).model, sample_rate)

    def train(self, mode: bool = True) -> PhoneLoss:
        super().train(mode)
        self.recogniser.eval()  # always: the recogniser is a fixed measuring instrument
        return self

    def forward(self, real: torch.Tensor, fake: torch.Tensor) -> PhoneLosses:
        if real.shape != fake.shape or real.dim() != 2:
            raise InputError(f"real and fake must be [batch, samples] of one shape, got {tuple(real.shape)} "
                             f"and {tuple(fake.shape)}")
        frames_per_token = self.recogniser.cfg.downsample
        with torch.no_grad():
            log_real = (self.bank @ whisper_power(real, self.sample_rate)).clamp_min(LOG10_FLOOR).log10()
            floor = log_real.amax(dim=(-2, -1), keepdim=True) - DYNAMIC_RANGE_DECADES
            usable = log_real.shape[-1] // frames_per_token * frames_per_token
            if usable == 0:
                raise InputError(f"crops of {real.shape[-1]} samples are shorter than one recogniser frame")
            hidden_real, _ = self.recogniser.encode(self._scaled(log_real, floor)[..., :usable])
            log_p_real = F.log_softmax(self.recogniser.frame_logits(hidden_real), dim=-1)
        log_fake = (self.bank @ whisper_power(fake, self.sample_rate)).clamp_min(LOG10_FLOOR).log10()
        hidden_fake, _ = self.recogniser.encode(self._scaled(log_fake, floor)[..., :usable])
        log_p_fake = F.log_softmax(self.recogniser.frame_logits(hidden_fake), dim=-1)
        feature = F.l1_loss(hidden_fake, hidden_real)
        posterior = F.kl_div(log_p_fake, log_p_real, log_target=True, reduction="none").sum(-1).mean()
        return PhoneLosses(feature, posterior)

    @staticmethod
    def _scaled(log_mel: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        """Whisper's last two steps: the 8-decade floor (the real crop's), then ``(x + 4) / 4``."""
        return (torch.maximum(log_mel, floor) + 4.0) / 4.0
