"""The supervised FSQ speech tokenizer as PyTorch modules.

See docs/training_components.md, "1. Supervised FSQ speech tokenizer".

Pipeline: whisper log-mel ``[B, 128, T]`` (100 Hz) -> strided convs (25 Hz) -> Encoder1 (rotary transformer)
-> down-projection to D dims -> ``round(K * tanh(.))``: D integers in ``[-K, K]`` -> one id in the ``(2K + 1)``-ary
system (:mod:`cadenza.layers.fsq_codes`). Training adds: up-projection -> Encoder2 -> CTC head over characters, so
the codes are forced to carry what an ASR model needs (the "supervised" in the name).

:class:`SpeechTokenizerModel` is what inference needs (and what ``speech_tokenizer.safetensors`` holds);
:class:`SupervisedSpeechTokenizer` wraps it with the training-only parts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from cadenza.errors import InputError
from cadenza.layers.fsq import ScalarQuantizer
from cadenza.layers.fsq_codes import codes_to_index, index_to_codes
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.encoder import ConvDownsampler, TransformerEncoder, valid_mask


class SpeechTokenizerModel(nn.Module):
    """Log-mel -> 25 Hz token ids. Parameter groups: ``downsample``, ``encoder`` (Encoder1), ``quantizer``
    (``in_proj`` = down-projection to D, ``out_proj`` = up-projection back to H, used by training and
    :meth:`embed_ids`)."""

    def __init__(self, cfg: SpeechTokenizerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.downsample = ConvDownsampler(cfg)
        self.encoder = TransformerEncoder(cfg, cfg.encoder1_layers)
        # FSQ codes (the paper's), or a frame classifier over given labels (``frame_classes``; no quantiser).
        self.quantizer = (None if cfg.frame_classes else
                          ScalarQuantizer(cfg.hidden_size, cfg.hidden_size, cfg.fsq_dims, cfg.fsq_scale))
        self.classifier = nn.Linear(cfg.hidden_size, cfg.frame_classes) if cfg.frame_classes else None

    def token_lengths(self, mel_lengths: torch.Tensor) -> torch.Tensor:
        """Mel frames ``[B]`` -> token count ``[B]`` (``frames // downsample``)."""
        return torch.div(mel_lengths, self.cfg.downsample, rounding_mode="floor")

    def encode(self, mel: torch.Tensor, mel_lengths: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mel [B, n_mels, T]`` (+ real lengths ``[B]``, default all T) -> Encoder1 output ``[B, T', H]`` and the
        bool mask of real tokens ``[B, T']``, ``T' = T // downsample``."""
        if mel.dim() != 3 or mel.shape[1] != self.cfg.n_mels:
            raise InputError(f"log-mel must be [batch, {self.cfg.n_mels}, frames], got {tuple(mel.shape)}")
        if mel.shape[-1] < self.cfg.downsample:
            raise InputError(f"log-mel has {mel.shape[-1]} frames, fewer than one token "
                             f"({self.cfg.downsample} frames, {self.cfg.downsample * 10} ms)")
        if mel_lengths is None:
            mel_lengths = torch.full((mel.shape[0],), mel.shape[-1], dtype=torch.long, device=mel.device)
        x = self.downsample(mel)
        mask = valid_mask(self.token_lengths(mel_lengths).clamp(min=1), x.shape[1])
        return self.encoder(x, mask), mask

    def codes(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder1 output ``[..., H]`` -> integer-valued codes ``[..., D]`` in ``[-K, K]`` (FSQ tokenizers)."""
        if self.quantizer is None:
            raise InputError("a frame-classifier tokenizer has no FSQ codes")
        return self.quantizer.codes(hidden)

    def frame_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder1 output ``[..., H]`` -> class logits ``[..., frame_classes]`` (frame-classifier tokenizers)."""
        if self.classifier is None:
            raise InputError("an FSQ tokenizer has no frame classifier")
        return self.classifier(hidden)

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``mel [B, n_mels, T]`` -> ids ``[B, T // downsample]`` int64 in ``[0, codebook_size)``; positions past
        an utterance's own ``mel_lengths[b] // downsample`` hold -1."""
        hidden, mask = self.encode(mel, mel_lengths)
        if self.classifier is not None:
            ids = self.frame_logits(hidden).argmax(-1)
        else:
            ids = codes_to_index(self.codes(hidden), self.cfg.fsq_scale)
        return ids.masked_fill(~mask, -1)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``[...]`` -> up-projected code vectors ``[..., H]`` (the input of Encoder2)."""
        if self.quantizer is None:
            raise InputError("a frame-classifier tokenizer has no code vectors")
        codes = index_to_codes(ids, self.cfg.fsq_scale, self.cfg.fsq_dims).to(self.quantizer.out_proj.weight.dtype)
        return self.quantizer.out_proj(codes / self.cfg.fsq_scale)


SATURATION_KNEE = 1.5  # |pre-tanh activation| above which tanh' < 0.2: the latent is nearly frozen


class SupervisedOutput(NamedTuple):
    """Training forward of :class:`SupervisedSpeechTokenizer` (a named tuple, which DDP and pytree traverse).

    Attributes:
        log_probs: ``[B, T', vocab_size]`` CTC log-probabilities (blank = 0).
        lengths: ``[B]`` real token frames per utterance.
        ids: ``[B, T']`` token ids (-1 on padding), without gradient.
        mel: ``[B, n_mels, T' * downsample]`` the input log-mel predicted back from the codes (only with
            ``reconstruct=True``; else an empty tensor).
        saturation: ``[]`` mean of ``relu(|a| - 1.5)^2`` over the quantiser's pre-tanh activations ``a`` of real
            frames: > 0 when latents sit deep in tanh's flat tails, where the straight-through gradient vanishes and
            the latent dimension freezes at one code value (a training regulariser may penalise it).
    """

    log_probs: torch.Tensor
    lengths: torch.Tensor
    ids: torch.Tensor
    mel: torch.Tensor
    saturation: torch.Tensor


class SupervisedSpeechTokenizer(nn.Module):
    """Tokenizer + (up-projection ->) Encoder2 -> linear CTC head; the straight-through estimator lets the ASR
    gradient reach Encoder1 through the rounding.

    ``reconstruct=True`` adds a linear head predicting the input log-mel from Encoder2's output (an auxiliary
    training loss: its dense per-frame gradient keeps the codes in use from the first steps, while the CTC loss
    alone sits on its all-blank plateau for many steps with the codebook collapsed to a few ids)."""

    def __init__(self, cfg: SpeechTokenizerConfig, reconstruct: bool = False) -> None:
        super().__init__()
        if cfg.vocab_size < 2:
            raise InputError("the supervised tokenizer needs an ASR vocabulary: set vocab_size (blank + symbols)")
        if cfg.frame_classes:
            raise InputError("a frame-classifier tokenizer (frame_classes > 0) trains with the frame_tokenizer stage")
        self.cfg = cfg
        self.tokenizer = SpeechTokenizerModel(cfg)
        self.encoder2 = TransformerEncoder(cfg, cfg.encoder2_layers)
        self.asr_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.mel_head = nn.Linear(cfg.hidden_size, cfg.n_mels * cfg.downsample) if reconstruct else None

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> SupervisedOutput:
        hidden, mask = self.tokenizer.encode(mel, mel_lengths)
        with torch.no_grad():
            ids = codes_to_index(self.tokenizer.codes(hidden), self.cfg.fsq_scale).masked_fill(~mask, -1)
        x = self.encoder2(self.tokenizer.quantizer(hidden), mask)
        log_probs = torch.log_softmax(self.asr_head(x).float(), dim=-1)
        mel_out = x.new_zeros(0)
        if self.mel_head is not None:  # [B, T', n_mels * ds] -> [B, n_mels, T' * ds] (frame-major within a token)
            b, t, _ = x.shape
            mel_out = self.mel_head(x).reshape(b, t * self.cfg.downsample, self.cfg.n_mels).transpose(1, 2)
        pre = self.tokenizer.quantizer.in_proj(hidden)
        excess = torch.relu(pre.abs() - SATURATION_KNEE).pow(2).mean(-1)
        saturation = (excess * mask).sum() / mask.sum().clamp_min(1)
        return SupervisedOutput(log_probs=log_probs, lengths=mask.sum(1), ids=ids, mel=mel_out, saturation=saturation)
