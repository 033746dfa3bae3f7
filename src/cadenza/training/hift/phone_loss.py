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

from cadenza.audio.whisper_mel import whisper_log10_mel, whisper_power, whisper_scaled_log_mel
from cadenza.builtin import local_model_path
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

    @classmethod
    def from_path(cls, path: str | Path, sample_rate: int) -> PhoneLoss:
        """From a folder holding ``speech_tokenizer.json`` + ``.safetensors`` (e.g. a cadenza-tiny model folder;
        ``"cadenza-tiny"`` names the built-in one)."""
        return cls(load_speech_tokenizer(local_model_path(path)).model, sample_rate)

    def train(self, mode: bool = True) -> PhoneLoss:
        super().train(mode)
        self.recogniser.eval()  # always: the recogniser is a fixed measuring instrument
        return self

    def forward(self, real: torch.Tensor, fake: torch.Tensor) -> PhoneLosses:
        if real.shape != fake.shape or real.dim() != 2:
            raise InputError(f"real and fake must be [batch, samples] of one shape, got {tuple(real.shape)} "
                             f"and {tuple(fake.shape)}")
        frames_per_token, n_mels = self.recogniser.cfg.downsample, self.recogniser.cfg.n_mels
        with torch.no_grad():
            log_real = whisper_log10_mel(whisper_power(real, self.sample_rate), n_mels)
            ceiling = log_real.amax(dim=(-2, -1), keepdim=True)  # the real crop's: both share its floor
            usable = log_real.shape[-1] // frames_per_token * frames_per_token
            if usable == 0:
                raise InputError(f"crops of {real.shape[-1]} samples are shorter than one recogniser frame")
            hidden_real, _ = self.recogniser.encode(whisper_scaled_log_mel(log_real, ceiling)[..., :usable])
            log_p_real = F.log_softmax(self.recogniser.frame_logits(hidden_real), dim=-1)
        log_fake = whisper_log10_mel(whisper_power(fake, self.sample_rate), n_mels)
        hidden_fake, _ = self.recogniser.encode(whisper_scaled_log_mel(log_fake, ceiling)[..., :usable])
        log_p_fake = F.log_softmax(self.recogniser.frame_logits(hidden_fake), dim=-1)
        feature = F.l1_loss(hidden_fake, hidden_real)
        posterior = F.kl_div(log_p_fake, log_p_real, log_target=True, reduction="none").sum(-1).mean()
        return PhoneLosses(feature, posterior)
