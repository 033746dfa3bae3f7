"""The MiniCPM-4 transformer stack shared by all four VoxCPM 2 networks (docs/design.md, "VoxCPM 2 networks").

Pre-norm blocks ``h = x + a·Attn(RMSNorm(x))``, ``y = h + a·SwiGLU(RMSNorm(h))`` with ``a = scale_depth /
sqrt(layers)`` under muP (1 otherwise), a final RMSNorm, grouped-query attention without biases, and LongRoPE
(or no positional encoding at all for the residual LM's ``no_rope``). Parameter names match the reference
(``layers.{i}.self_attn.q_proj`` ...), so the checkpoint's ``base_lm.*``, ``residual_lm.*``,
``feat_encoder.encoder.*`` and ``feat_decoder.estimator.decoder.*`` keys load unchanged.

Why not ``cadenza.layers.attention.GQASelfAttention``: it always applies RoPE (the RALM has none), rotates in the
input dtype (MiniCPM rotates in float32) and has no bidirectional mode (LocEnc / LocDiT attend both ways).
Every projection is a plain ``nn.Linear`` so LoRA can wrap them in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cadenza.layers.attention import causal_mask_with_past
from cadenza.layers.embedding import Embedding
from cadenza.layers.kv_cache import KVCache
from cadenza.layers.longrope import LongRoPE, apply_rotary_fp32
from cadenza.layers.rms_norm import RMSNorm
from cadenza.layers.swiglu import SwiGLU
from cadenza.models.voxcpm2.config import MiniCPM4Config

Rope = tuple[torch.Tensor, torch.Tensor]


class MiniCPMAttention(nn.Module):
    """GQA self-attention: ``num_attention_heads`` query heads share ``num_key_value_heads`` kv heads
    (query head j uses kv head ``j // groups``). q/o width is ``heads * head_dim``, which may differ from hidden."""

    def __init__(self, cfg: MiniCPM4Config) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, rope: Rope | None, causal: bool, cache: KVCache | list[KVCache] | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """x ``[B, n, hidden]`` -> ``[B, n, hidden]``.

        ``rope``: cos/sin ``[n, head_dim]`` of the n new positions (``[B, 1, n, head_dim]`` with per-row caches),
        or None (no positional encoding).
        ``causal``: query i sees keys ``<= past + i``; otherwise every key (bidirectional, no cache expected).
        With a ``cache`` the new keys (after RoPE) and values are appended and attention covers past + new.
        A list of B caches (one per row, of any lengths) takes one decode step (``n = 1``) of B requests.
        """
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary_fp32(q, *rope), apply_rotary_fp32(k, *rope)
        if isinstance(cache, list):
            out = self._attend_per_row(q, k, v, cache, layer_idx)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))
        past = 0
        if cache is not None:
            past = cache.layer_length(layer_idx)
            k, v = cache.append(layer_idx, k, v)
        mask, is_causal = None, False
        if causal and n > 1:
            if past == 0:
                is_causal = True
            else:  # SDPA's is_causal aligns the triangle top-left, wrong when keys include a past
                mask = causal_mask_with_past(n, past, x.device)
        elif n == 1 and past > 0 and x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
            k, v, mask = _pad_keys_like_static_cache(k, v)
        out = F.scaled_dot_product_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), attn_mask=mask, is_causal=is_causal,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))

    def _attend_per_row(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, caches: list[KVCache],
                        layer_idx: int) -> torch.Tensor:
        """q ``[B, heads, 1, d]``, k/v ``[B, kv_heads, 1, d]``: row i appends to and attends ``caches[i]`` exactly as
        a batch-1 step would (same keys, same padding), so only the batched projections around it see B rows.
        Per-row calls avoid padding and copying caches of different lengths (as ``layers/attention.py`` does)."""
        if q.shape[2] != 1 or len(caches) != q.shape[0]:
            raise ValueError("per-request caches need one cache per row and a single new position")
        rows = []
        for i, cache in enumerate(caches):
            past = cache.layer_length(layer_idx)
            ki, vi = cache.append(layer_idx, k[i : i + 1], v[i : i + 1])
            mask = None
            if past > 0 and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
                ki, vi, mask = _pad_keys_like_static_cache(ki, vi)
            rows.append(F.scaled_dot_product_attention(
                q[i : i + 1].contiguous(), ki.contiguous(), vi.contiguous(), attn_mask=mask,
                enable_gqa=self.num_heads != self.num_kv_heads,
            ))
        return torch.cat(rows)


# The reference decodes against a static, zero-filled cache of ``max_length`` positions with a boolean mask. On CPU
# the reduced-precision SDPA kernel sums a key length that is not a multiple of its vector width in another order, so
# bf16 steps then differ from the reference by an ulp. Padding the keys with masked zeros to a multiple of this block
# reproduces the reference's bf16 decode steps bit for bit (measured on the tiny fixture model) at the cost of < 16
# extra keys; float32 is unaffected (differences there are ~1e-7) and takes the unpadded path.
REFERENCE_KEY_BLOCK = 16


def _pad_keys_like_static_cache(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k/v ``[B, kv_heads, T, d]`` -> zero-padded to a multiple of ``REFERENCE_KEY_BLOCK`` keys + bool mask
    ``[1, 1, 1, T']`` that hides the padding."""
    t = k.shape[2]
    pad = -t % REFERENCE_KEY_BLOCK
    k = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], dim=2)
    v = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], dim=2)
    mask = (torch.arange(t + pad, device=k.device) < t).view(1, 1, 1, -1)
    return k, v, mask


class MiniCPMDecoderLayer(nn.Module):
    """One pre-norm block (names ``self_attn``, ``mlp``, ``input_layernorm``, ``post_attention_layernorm``)."""

    def __init__(self, cfg: MiniCPM4Config) -> None:
        super().__init__()
        self.self_attn = MiniCPMAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.use_mup = cfg.use_mup
        self.residual_scale = cfg.residual_scale

    def forward(
        self, x: torch.Tensor, rope: Rope | None, causal: bool, cache: KVCache | list[KVCache] | None, layer_idx: int
    ) -> torch.Tensor:
        """x ``[B, n, hidden]`` -> ``[B, n, hidden]``."""
        h = self.self_attn(self.input_layernorm(x), rope, causal, cache, layer_idx)
        x = x + (h * self.residual_scale if self.use_mup else h)
        h = self.mlp(self.post_attention_layernorm(x))
        return x + (h * self.residual_scale if self.use_mup else h)


class MiniCPMModel(nn.Module):
    """Optional token embedding + decoder layers + final RMSNorm, driven by input embeddings.

    ``embed_tokens`` exists only when ``vocab_size > 0`` (the TSLM); the other stacks have no embedding (the
    reference's ``nn.Identity``, which owns no parameters). ``rope`` is None for ``no_rope`` stacks.

    ``activation_checkpointing`` (a plain attribute, so parameter names and state-dict keys stay the same): while
    training with gradients on and no cache, each layer's activations are dropped after the forward pass and
    recomputed in the backward pass (``torch.utils.checkpoint``), trading ~one more forward for memory.
    """

    def __init__(self, cfg: MiniCPM4Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = False
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.vocab_size > 0 else None
        self.layers = nn.ModuleList(MiniCPMDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope = None
        if not cfg.no_rope:
            # Only the list in use matters; a one-value list applies to every frequency (the reference broadcasts
            # it: repeating it gives the same products bit for bit).
            factors = cfg.rope_factors
            if len(factors) == 1:
                factors = factors * (cfg.head_dim // 2)
            self.rope = LongRoPE(cfg.head_dim, cfg.rope_theta, factors, factors, cfg.max_position_embeddings,
                                 cfg.rope_scaling.original_max_position_embeddings)

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache for this stack (one per request); ``capacity`` positions are reserved on first use."""
        return KVCache(self.cfg.num_hidden_layers, capacity)

    def forward(self, inputs_embeds: torch.Tensor, causal: bool = True,
                cache: KVCache | list[KVCache] | None = None) -> torch.Tensor:
        """``[B, n, hidden]`` -> hidden states after the final norm ``[B, n, hidden]``.

        Positions are ``past .. past + n - 1`` where ``past`` is the cache length (0 without a cache), so a decode
        step is simply a call with ``n = 1`` and the request's cache. With a list of B caches (one per row, any
        lengths; ``n = 1``) row i continues at its own cache's length: one decode step of B requests.
        """
        n = inputs_embeds.shape[1]
        rope = None
        if self.rope is not None and isinstance(cache, list):
            positions = torch.tensor([c.length for c in cache], device=inputs_embeds.device)[:, None]  # [B, 1]
            cos, sin = self.rope(positions, inputs_embeds.dtype)  # [B, 1, head_dim]: the rows' own positions
            rope = cos[:, None], sin[:, None]
        elif self.rope is not None:
            past = cache.length if cache is not None else 0
            positions = torch.arange(past, past + n, device=inputs_embeds.device)
            rope = self.rope(positions, inputs_embeds.dtype)
        x = inputs_embeds
        recompute = self.activation_checkpointing and self.training and cache is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if recompute:
                x = checkpoint(layer, x, rope, causal, None, i, use_reentrant=False)
            else:
                x = layer(x, rope, causal, cache, i)
        return self.norm(x)


def set_activation_checkpointing(root: nn.Module, enabled: bool) -> int:
    """Turn per-layer activation checkpointing on or off in every MiniCPM-4 stack under ``root`` (VoxCPM 2: the
    base LM, the residual LM, the LocEnc and the LocDiT); returns how many stacks were set."""
    stacks = [m for m in root.modules() if isinstance(m, MiniCPMModel)]
    for stack in stacks:
        stack.activation_checkpointing = enabled
    return len(stacks)
