"""LM sequence layouts of every mode and the latent <-> patch reshapes.

See docs/design.md, "VoxCPM 2 sequence layouts" and "VoxCPM 2 prompt audio and decoding".

Every position carries a text id, a latent patch ``[P, D]`` and exactly one of ``text_mask`` / ``audio_mask``.
Text positions have an all-zero patch; audio positions carry text id 0.

| mode | layout |
| --- | --- |
| zero-shot (voice design = a ``(description)`` prefix in the text) | ``X, 101`` |
| reference | ``103, R, 104, X, 101`` |
| continuation | ``X', 101, Q`` with ``X' = ids(prompt_text + target_text)`` (no separator) |
| reference + continuation | ``103, R, 104, X', 101, Q`` |

Reference patches come from right-padded audio, prompt patches from **left**-padded audio, so the prompt's last
patch is flush with the generation start (padding happens where the audio is encoded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from cadenza.errors import InputError, TextError
from cadenza.models.voxcpm2.config import SpecialTokens, VoxCPM2Config

MODES = ("zero_shot", "reference", "continuation", "ref_continuation")


def latents_to_patches(latents: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``[1, D, k·P]`` VAE latents -> ``[k, P, D]`` patches (frame ``P·j + p`` -> patch j, slot p)."""
    if latents.dim() != 3 or latents.size(0) != 1 or latents.size(2) % patch_size:
        raise InputError(f"latents must be [1, D, k*{patch_size}], got {tuple(latents.shape)}")
    d = latents.size(1)
    return latents[0].reshape(d, -1, patch_size).permute(1, 2, 0)


def patches_to_latents(patches: torch.Tensor) -> torch.Tensor:
    """``[k, P, D]`` patches -> ``[1, D, k·P]`` latents (inverse of ``latents_to_patches``)."""
    k, p, d = patches.shape
    return patches.permute(2, 0, 1).reshape(1, d, k * p)


@dataclass(frozen=True, eq=False)
class VoicePrompt:
    """What the reference calls a prompt cache: reference patches and/or a continuation prompt (text + patches).

    ``None`` everywhere is not allowed (use no prompt for zero-shot). ``prompt_text`` and ``prompt_patches`` come
    together.
    """

    ref_patches: torch.Tensor | None = None  # [r, P, D]
    prompt_text: str | None = None
    prompt_patches: torch.Tensor | None = None  # [q, P, D]

    def __post_init__(self) -> None:
        if (self.prompt_text is None) != (self.prompt_patches is None):
            raise InputError("a continuation prompt needs both its text and its audio")
        if self.ref_patches is None and self.prompt_patches is None:
            raise InputError("a voice prompt needs reference audio, prompt audio (with its text), or both")
        for name in ("ref_patches", "prompt_patches"):
            t = getattr(self, name)
            if t is not None and (t.dim() != 3 or t.size(0) == 0):
                raise InputError(f"{name} must be a non-empty [k, P, D] tensor, got {tuple(t.shape)}")

    @property
    def mode(self) -> str:
        if self.ref_patches is not None:
            return "ref_continuation" if self.prompt_patches is not None else "reference"
        return "continuation"

    def merged(self, new_text: str, new_patches: torch.Tensor) -> VoicePrompt:
        """Append generated text/patches to the continuation prompt (keeps the reference), for long-form speech."""
        old = self.prompt_patches if self.prompt_patches is not None else new_patches[:0]
        return VoicePrompt(self.ref_patches, (self.prompt_text or "") + new_text, torch.cat([old, new_patches]))


@dataclass(frozen=True, eq=False)
class SequenceLayout:
    """One request's prompt sequence (batch dimension added by the caller).

    text_tokens ``[T]`` int64, text_mask / audio_mask ``[T]`` int32, audio_feat ``[T, P, D]`` float32.
    """

    text_tokens: torch.Tensor
    text_mask: torch.Tensor
    audio_feat: torch.Tensor
    audio_mask: torch.Tensor

    def __post_init__(self) -> None:
        n = self.text_tokens.numel()
        if n == 0 or any(t.dim() != 1 or t.numel() != n for t in (self.text_tokens, self.text_mask, self.audio_mask)):
            raise InputError("layout tokens and masks must be non-empty 1-D tensors of one length")
        if self.audio_feat.dim() != 3 or self.audio_feat.size(0) != n:
            raise InputError(f"layout audio_feat must be [{n}, P, D], got {tuple(self.audio_feat.shape)}")
        if not torch.equal(self.text_mask.long() + self.audio_mask.long(), torch.ones_like(self.text_tokens).long()):
            raise InputError("every layout position must be exactly one of text or audio")

    def __len__(self) -> int:
        return self.text_tokens.numel()

    @property
    def ends_with_audio(self) -> bool:
        """True in continuation modes: generation continues the prompt audio."""
        return bool(self.audio_mask[-1])

    def context_patches(self, max_context: int) -> torch.Tensor:
        """The last ``min(max_context, #audio positions)`` audio patches ``[c, P, D]`` when the layout ends with audio
        (the decoder warm-up of continuation modes), else an empty ``[0, P, D]``. As in the reference, the audio
        positions counted include reference positions (only reachable with a prompt shorter than ``max_context``)."""
        if not self.ends_with_audio or max_context <= 0:
            return self.audio_feat[:0]
        idx = self.audio_mask.nonzero(as_tuple=True)[0]
        return self.audio_feat[idx[-min(max_context, idx.numel()):]]


def _segment(ids: list[int], feats: torch.Tensor, text: bool) -> tuple[torch.Tensor, ...]:
    n = feats.size(0)
    mask = torch.ones(n, dtype=torch.int32) if text else torch.zeros(n, dtype=torch.int32)
    return torch.tensor(ids, dtype=torch.int64), mask, feats, 1 - mask


def build_layout(
    text_ids: list[int],
    patch_size: int,
    feat_dim: int,
    ref_patches: torch.Tensor | None = None,
    prompt_patches: torch.Tensor | None = None,
    special: SpecialTokens | None = None,
) -> SequenceLayout:
    """Layout from the ids of the (already concatenated) text and the optional reference / prompt patches."""
    special = special or SpecialTokens()
    if not text_ids:
        raise InputError("the text has no tokens")

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, patch_size, feat_dim, dtype=torch.float32)

    def check(name: str, t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 3 or tuple(t.shape[1:]) != (patch_size, feat_dim):
            raise InputError(f"{name} must be [k, {patch_size}, {feat_dim}], got {tuple(t.shape)}")
        return t.detach().to("cpu", torch.float32)

    segments = []
    if ref_patches is not None:
        ref = check("reference patches", ref_patches)
        segments += [
            _segment([special.ref_audio_start], zeros(1), text=True),
            _segment([special.audio_pad] * ref.size(0), ref, text=False),
            _segment([special.ref_audio_end], zeros(1), text=True),
        ]
    ids = list(text_ids) + [special.audio_start]
    segments.append(_segment(ids, zeros(len(ids)), text=True))
    if prompt_patches is not None:
        prompt = check("prompt patches", prompt_patches)
        segments.append(_segment([special.audio_pad] * prompt.size(0), prompt, text=False))
    tokens, tmask, feats, amask = (torch.cat(parts) for parts in zip(*segments))
    return SequenceLayout(tokens, tmask, feats, amask)


def layout_text(target_text: str, prompt: VoicePrompt | None) -> str:
    """The text the LM reads: ``prompt_text + target_text`` in continuation modes, else the target text."""
    if prompt is not None and prompt.prompt_text is not None:
        return prompt.prompt_text + target_text
    return target_text


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def make_layout(
    tokenizer: _Encoder, config: VoxCPM2Config, target_text: str, prompt: VoicePrompt | None = None
) -> tuple[SequenceLayout, int]:
    """The layout of a request and the number of ids of the target text alone (for ``generate.length_cap``).

    ``target_text`` should already be cleaned (``text.clean_text``); continuation prompts prepend their text.
    """
    ids = tokenizer.encode(layout_text(target_text, prompt))
    target_len = len(tokenizer.encode(target_text))
    layout = build_layout(
        ids, config.patch_size, config.feat_dim,
        ref_patches=prompt.ref_patches if prompt is not None else None,
        prompt_patches=prompt.prompt_patches if prompt is not None else None,
        special=config.special_tokens,
    )
    # A tokenizer (or special id) beyond the model's embedding table: the reference loads such a folder and fails
    # on the texts that reach the extra ids; we refuse those texts clearly.
    vocab = config.lm_config.vocab_size
    outside = sorted({int(i) for i in layout.text_tokens[layout.text_mask.bool()] if i >= vocab})
    if outside:
        raise TextError(f"the request uses token ids {outside} that the model does not embed (vocab_size {vocab})")
    return layout, target_len
