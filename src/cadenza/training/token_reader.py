"""A token reader: a small CTC character ASR over an LM's speech-token ids, for tokenizers without FSQ codes.

See docs/training.md, "Reinforcement stage". ``L_ASR`` needs a differentiable way from a distribution over the LM's
speech ids to a transcript. For a supervised FSQ tokenizer that is the tokenizer's own ASR half
(``asr_reward.TokenASRBackend``); a frame-classifier tokenizer (cadenza-tiny v2: phoneme-per-frame ids) has no codes
and no ASR head, so the reader learns one from the prepared LM corpus (``speech_tokens`` + transcripts)::

    token_probs [B, T, V] (one-hot for corpus tokens, Gumbel-softmax samples in L_ASR)
      @ embedding table [V, H]            (the differentiable "code inverse": a one-hot row picks one id's vector)
      -> each token repeated frames_per_token times [B, T * r, H]   (room for CTC: ~15 characters/s vs 25 tokens/s)
      -> bidirectional rotary transformer (the speech tokenizer's Encoder2 blocks) -> CTC head -> log-probs [B, T*r, C]

On disk (``cadenza train token_reader --out`` writes it; ``asr_reward.reader`` reads it)::

    token_reader.safetensors   TokenReader.state_dict() (float32)
    token_reader.json          {"format": "cadenza.token_reader", "version": 1, "config": {...},
                                "metadata": {"asr_vocab": {...}, held-out figures}}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cadenza.errors import CheckpointError, InputError
from cadenza.loading import load_into
from cadenza.loading.bundle import BundleFormat
from cadenza.models.speech_tokenizer.char_vocab import CharVocab
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.encoder import TransformerEncoder

BUNDLE = BundleFormat("token_reader", version=1, what="token reader")


@dataclass(frozen=True)
class TokenReaderConfig:
    """Sizes of a token reader.

    Attributes:
        codebook_size: V, the speech-token ids it reads (the LM's ``speech_token_size``).
        vocab_size: CTC classes including blank and unknown (set from the training transcripts' characters).
        hidden_size, num_heads, ffn_size, num_layers: the transformer (head_dim = hidden / heads, even).
        frames_per_token: each token becomes this many encoder frames (CTC needs at least one frame per character
            plus one between repeated characters; 2 doubles the room at 25 tokens/s).
        rope_theta, norm_eps: rotary base and RMSNorm epsilon.
    """

    codebook_size: int = 0
    vocab_size: int = 0
    hidden_size: int = 128
    num_heads: int = 4
    ffn_size: int = 384
    num_layers: int = 3
    frames_per_token: int = 2
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("codebook_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise InputError(f"token reader config: {name} must be an integer >= 2, got {value!r}")
        for name in ("hidden_size", "num_heads", "ffn_size", "num_layers", "frames_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"token reader config: {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise InputError(f"token reader config: hidden_size {self.hidden_size} / num_heads {self.num_heads} "
                             f"must be a whole, even head size")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InputError(f"token reader config: {name} must be a positive number, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TokenReaderConfig:
        if not isinstance(data, dict):
            raise InputError(f"token reader config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"token reader config: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**data)

    def encoder_config(self) -> SpeechTokenizerConfig:
        """The speech tokenizer's config carrying this reader's transformer sizes: ``TransformerEncoder`` (the
        tokenizer's Encoder2 blocks) is built from it; its audio fields are unused here."""
        return SpeechTokenizerConfig(hidden_size=self.hidden_size, num_heads=self.num_heads, ffn_size=self.ffn_size,
                                     encoder2_layers=self.num_layers, rope_theta=float(self.rope_theta),
                                     norm_eps=float(self.norm_eps))


class TokenReader(nn.Module):
    """Speech-token distributions -> CTC character log-probs; the ``asr_reward`` backend interface.

    ``forward(token_probs [B, T, V] or ids [B, T], mask [B, T] bool) -> log_probs [B, T * r, C]`` (blank = 0), with
    ``r = frames_per_token``; ``output_mask(mask)`` gives the ``[B, T * r]`` frame mask of that output.
    """

    def __init__(self, cfg: TokenReaderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.hidden_size)
        self.encoder = TransformerEncoder(cfg.encoder_config(), cfg.num_layers)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    @property
    def codebook_size(self) -> int:
        return self.cfg.codebook_size

    @property
    def frames_per_token(self) -> int:
        return self.cfg.frames_per_token

    def output_mask(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.repeat_interleave(self.cfg.frames_per_token, dim=1)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``tokens``: distributions ``[B, T, V]`` (float; soft lookup, differentiable) or ids ``[B, T]`` (integer;
        the same as their one-hot rows, any value at padded positions)."""
        if tokens.is_floating_point():
            x = tokens.to(self.embedding.weight.dtype) @ self.embedding.weight  # [B, T, H]
        else:
            x = self.embedding(tokens.clamp(0, self.cfg.codebook_size - 1))
        return self._read(x, mask)

    def _read(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        r = self.cfg.frames_per_token
        x = self.encoder(x.repeat_interleave(r, dim=1), mask.repeat_interleave(r, dim=1))
        return torch.log_softmax(self.head(x).float(), dim=-1)


def save_token_reader(model: TokenReader, vocab: CharVocab, directory: str | Path,
                      metadata: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``token_reader.safetensors`` + ``token_reader.json`` (the character vocabulary in its metadata)."""
    return BUNDLE.save(model.state_dict(), model.cfg.to_dict(), directory,
                       {**(metadata or {}), "asr_vocab": vocab.to_dict()})


def find_token_reader(directory: str | Path) -> Path | None:
    """``directory / token_reader.safetensors`` if it and its JSON exist, else None."""
    return BUNDLE.find(directory)


def load_token_reader(path: str | Path, device: str | torch.device = "cpu") -> tuple[TokenReader, CharVocab, Path]:
    """(reader in eval mode, its character vocabulary, the weights path) from a folder or either file's path.

    Raises ``CheckpointError`` for missing or unreadable files, an invalid config, or weights that do not fit it.
    """
    doc, state, weights = BUNDLE.read(path)
    json_path = weights.with_suffix(".json")
    vocab_doc = doc.get("metadata", {}).get("asr_vocab")
    try:
        cfg = TokenReaderConfig.from_dict(doc["config"])
        if not isinstance(vocab_doc, dict):
            raise InputError("metadata.asr_vocab (the CTC head's characters) is missing")
        vocab = CharVocab.from_dict(vocab_doc)
    except (InputError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{json_path}: {exc}") from exc
    if len(vocab) != cfg.vocab_size:
        raise CheckpointError(f"{json_path}: asr_vocab has {len(vocab)} classes, the config says {cfg.vocab_size}")
    model = TokenReader(cfg)
    load_into(model, state, str(weights))
    return model.to(device).eval(), vocab, weights
