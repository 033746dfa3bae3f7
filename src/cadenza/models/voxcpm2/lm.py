"""TSLM + RALM recurrence: prefill over the prompt layout, then one position per generated patch.

See docs/design.md, "VoxCPM 2 networks".

State after position t (what the next patch is conditioned on):
* ``lm_hidden``: TSLM output, FSQ-quantised if the position is audio (``e' = FSQ(e)·am + e·tm``);
* ``residual_hidden``: RALM output on ``fusion_concat_proj([e' ‖ am·patch_emb])``;
* ``prev_patch``: the latent patch at that position (the DiT's prefix condition).
Both LMs keep their own KV cache (one per request, ``cadenza.layers.kv_cache.KVCache``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cadenza.layers.kv_cache import KVCache
from cadenza.models.voxcpm2.layouts import SequenceLayout
from cadenza.models.voxcpm2.model import VoxCPM2Model


@dataclass
class LMState:
    """Per-request recurrent state. ``length`` = positions already in both caches."""

    lm_cache: KVCache
    residual_cache: KVCache
    lm_hidden: torch.Tensor  # [B, H]
    residual_hidden: torch.Tensor  # [B, H]
    prev_patch: torch.Tensor  # [B, P, D]

    @property
    def length(self) -> int:
        return self.lm_cache.length


def prefill(model: VoxCPM2Model, layout: SequenceLayout, capacity: int = 0) -> LMState:
    """Run both LMs over the whole layout (batch 1) and fill their caches (``capacity`` positions reserved)."""
    device, dtype = model.device, model.dtype
    ids = layout.text_tokens.to(device)[None]
    feats = layout.audio_feat.to(device=device, dtype=dtype)[None]
    tm = layout.text_mask.to(device=device, dtype=dtype)[None, :, None]
    am = layout.audio_mask.to(device=device, dtype=dtype)[None, :, None]

    feat_emb = model.embed_patches(feats)
    x = tm * model.embed_text(ids) + am * feat_emb
    lm_cache = model.base_lm.new_cache(capacity)
    enc = model.base_lm(x, causal=True, cache=lm_cache)
    enc = model.fsq_layer(enc) * am + enc * tm
    residual_cache = model.residual_lm.new_cache(capacity)
    res = model.residual_lm(model.fusion_concat_proj(torch.cat((enc, am * feat_emb), dim=-1)), True, residual_cache)
    return LMState(lm_cache, residual_cache, enc[:, -1], res[:, -1], feats[:, -1])


def advance(model: VoxCPM2Model, state: LMState, patch: torch.Tensor, patch_emb: torch.Tensor) -> None:
    """Feed one generated patch ``[B, P, D]`` (with its embedding ``[B, H]``) at the next position, in place."""
    lm_hidden = model.base_lm(patch_emb[:, None], causal=True, cache=state.lm_cache)[:, 0]
    lm_hidden = model.fsq_layer(lm_hidden)  # generated positions are audio: always quantised
    fused = model.fusion_concat_proj(torch.cat((lm_hidden, patch_emb), dim=-1))
    state.residual_hidden = model.residual_lm(fused[:, None], causal=True, cache=state.residual_cache)[:, 0]
    state.lm_hidden = lm_hidden
    state.prev_patch = patch


def advance_many(model: VoxCPM2Model, states: list[LMState], patches: torch.Tensor, patch_emb: torch.Tensor) -> None:
    """``advance`` for B requests at once: row i of ``patches`` ``[B, P, D]`` / ``patch_emb`` ``[B, H]`` is fed to
    ``states[i]``, whose caches may hold any number of positions. The projections run batched (one read of the
    weights for all rows); attention runs per row on each request's own caches. One state takes ``advance`` itself."""
    if len(states) == 1:
        advance(model, states[0], patches, patch_emb)
        return
    lm_hidden = model.base_lm(patch_emb[:, None], causal=True, cache=[s.lm_cache for s in states])[:, 0]
    lm_hidden = model.fsq_layer(lm_hidden)
    fused = model.fusion_concat_proj(torch.cat((lm_hidden, patch_emb), dim=-1))
    residual = model.residual_lm(fused[:, None], causal=True, cache=[s.residual_cache for s in states])[:, 0]
    for i, state in enumerate(states):
        state.lm_hidden, state.residual_hidden = lm_hidden[i : i + 1], residual[i : i + 1]
        state.prev_patch = patches[i : i + 1]
