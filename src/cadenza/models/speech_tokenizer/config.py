"""Typed hyper-parameters of the supervised FSQ speech tokenizer.

See docs/training_components.md, "1. Supervised FSQ speech tokenizer".

Stored in ``speech_tokenizer.json`` next to the weights; :meth:`SpeechTokenizerConfig.from_dict` rejects unknown keys
so that a typo in a training config does not silently fall back to a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from cadenza.errors import InputError
from cadenza.layers.fsq_codes import fsq_codebook_size


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(f"invalid speech tokenizer config: {msg}")


def _positive_real(name: str, value: object) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    _check(ok, f"{name} must be a positive finite number, got {value!r}")


def _positive_int(name: str, value: object, allow_zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    _check(ok, f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, got {value!r}")


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    """Sizes of the tokenizer (conv downsampler, Encoder1, FSQ) and of its training-only ASR part.

    Attributes:
        n_mels: whisper log-mel bins of the input (128 at 16 kHz, 100 frames/s).
        hidden_size: transformer width H of both encoders.
        num_heads: attention heads (head_dim = H / heads, even for the rotary embedding).
        ffn_size: SwiGLU inner size.
        encoder1_layers: blocks before the quantiser (the tokenizer proper).
        encoder2_layers: blocks after the up-projection (training only, feed the ASR head).
        conv_strides: time strides of the conv downsampler; their product is the token hop in mel frames (4:
            100 Hz -> 25 Hz).
        conv_kernel: odd kernel of every downsampling conv, at most ``2 * min(stride) - 1`` so that no token looks
            past the end of its utterance (a padded batch then gives the same ids as single utterances).
        fsq_dims: D, the width of the quantised bottleneck.
        fsq_scale: K; every code is an integer in ``[-K, K]``, the codebook has ``(2K + 1)^D`` ids.
        rope_theta: rotary embedding base.
        norm_eps: RMSNorm epsilon.
        vocab_size: ASR output classes including the CTC blank (0 = no ASR head, inference only).
        max_seconds: longest input the tokenizer accepts (the frontend checks prompt length against it).
        frame_classes: 0 for FSQ codes (the paper's tokenizer); > 0: the ids are instead the argmax of a linear
            classifier over Encoder1 with this many classes, trained on given per-token labels (cadenza-tiny v2:
            the phoneme each 40 ms frame lies in, from the teacher's own timings; no FSQ layer then).
    """

    n_mels: int = 128
    hidden_size: int = 512
    num_heads: int = 8
    ffn_size: int = 1536
    encoder1_layers: int = 6
    encoder2_layers: int = 6
    conv_strides: tuple[int, ...] = (2, 2)
    conv_kernel: int = 3
    fsq_dims: int = 8
    fsq_scale: int = 1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    vocab_size: int = 0
    max_seconds: float = 30.0
    frame_classes: int = 0

    def __post_init__(self) -> None:
        for name in ("n_mels", "hidden_size", "num_heads", "ffn_size", "encoder1_layers", "conv_kernel",
                     "fsq_dims", "fsq_scale"):
            _positive_int(name, getattr(self, name))
        _positive_int("encoder2_layers", self.encoder2_layers, allow_zero=True)
        _positive_int("vocab_size", self.vocab_size, allow_zero=True)
        _positive_int("frame_classes", self.frame_classes, allow_zero=True)
        _check(self.vocab_size != 1, "vocab_size must be 0 (no ASR head) or at least 2 (blank + one symbol)")
        _check(isinstance(self.conv_strides, tuple) and len(self.conv_strides) > 0
               and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in self.conv_strides),
               f"conv_strides must be a non-empty list of positive integers, got {self.conv_strides!r}")
        _check(self.conv_kernel % 2 == 1, f"conv_kernel must be odd, got {self.conv_kernel}")
        _check(self.conv_kernel // 2 <= min(self.conv_strides) - 1,
               f"conv_kernel {self.conv_kernel} would look past the end of an utterance with stride "
               f"{min(self.conv_strides)} (need conv_kernel <= 2 * stride - 1)")
        _check(self.hidden_size % self.num_heads == 0,
               f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        _check((self.hidden_size // self.num_heads) % 2 == 0, "head_dim (hidden_size / num_heads) must be even")
        for name in ("rope_theta", "norm_eps", "max_seconds"):
            _positive_real(name, getattr(self, name))

    @property
    def downsample(self) -> int:
        """Mel frames per token (4: 100 Hz mel -> 25 Hz tokens)."""
        n = 1
        for s in self.conv_strides:
            n *= s
        return n

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def codebook_size(self) -> int:
        """Number of token ids: ``frame_classes`` for a frame classifier, else ``(2 * fsq_scale + 1) ** fsq_dims``
        (6561 for K = 1, D = 8)."""
        if self.frame_classes:
            return self.frame_classes
        return fsq_codebook_size(self.fsq_scale, self.fsq_dims)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeechTokenizerConfig:
        """Build from a JSON / YAML mapping; lists become tuples; unknown keys raise ``InputError``."""
        _check(isinstance(data, Mapping), f"the config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        _check(not unknown, f"unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})
