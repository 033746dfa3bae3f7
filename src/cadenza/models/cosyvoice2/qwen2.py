"""A compact Qwen2 decoder (the body of the CosyVoice 2 text-speech LM; docs/design.md, "CosyVoice 2 LM structure").

Why not ``transformers.Qwen2ForCausalLM``:

* we control the KV-cache layout (``cadenza.layers.kv_cache.KVCache``: one pre-allocated buffer per layer per
  request), which the batched streaming engine needs; HF's cache classes re-concatenate on every step and their
  API is theirs to change;
* CosyVoice 2 only consumes the last hidden state, so the 151936-way ``lm_head`` (a 136 M-parameter matmul per
  step, ~30 % of a CPU decode step) is never built;
* transformers' internal model API (cache objects, mask helpers, attention dispatch) changed repeatedly across
  4.x/5.x; the released weights only need the few operations written out here.

Parameter names mirror HF so that ``llm.pt`` loads unchanged: ``Qwen2Encoder.model.model`` is the body, giving
``llm.model.model.*`` keys inside ``TextSpeechLM``. The checkpoint's ``llm.model.lm_head.weight`` is the tied copy
of ``embed_tokens`` and is dropped by the loader (see ``lm.TIED_LM_HEAD_KEY``).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.attention import GQASelfAttention
from cadenza.layers.embedding import Embedding
from cadenza.layers.kv_cache import KVCache
from cadenza.layers.kv_pool import PooledStep
from cadenza.layers.rms_norm import RMSNorm
from cadenza.layers.rotary import RotaryEmbedding
from cadenza.layers.swiglu import SwiGLU
from cadenza.models.cosyvoice2.config import Qwen2Config


class Qwen2DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.self_attn = GQASelfAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, qkv_bias=True, out_bias=False
        )
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | list[KVCache] | PooledStep | None,
        layer_idx: int,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, n, hidden]`` -> ``[B, n, hidden]``."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer_idx, attn_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    """Token embedding table + decoder layers + final RMSNorm (HF ``Qwen2Model``), driven by input embeddings."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.cfg = cfg
        # Only used by callers to embed text ids; forward() takes embeddings because CosyVoice 2 mixes text,
        # speech and special embeddings in one sequence.
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache sized for this model (one per request)."""
        return KVCache(self.cfg.num_hidden_layers, capacity)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | list[KVCache] | PooledStep | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """inputs_embeds ``[B, n, hidden]`` -> hidden states after the final norm ``[B, n, hidden]``.

        positions ``[B, n]`` (int) default to ``past .. past + n - 1`` where ``past`` = cached length (0 without a
        cache). With a cache the n new keys/values are appended to it. A list of B caches (one per row, any
        lengths) runs one batched decode step (n = 1) for B independent requests; so does a ``PooledStep`` (their
        caches in one ``KVPool``: ``layers/kv_pool.py``).
        """
        b, n, _ = inputs_embeds.shape
        if isinstance(cache, PooledStep) and positions is None:
            positions = cache.positions[:, None]
        elif isinstance(cache, list) and positions is None:
            positions = torch.tensor([[c.length] for c in cache], device=inputs_embeds.device)
        elif positions is None:
            past = cache.length if cache is not None else 0
            positions = torch.arange(past, past + n, device=inputs_embeds.device).expand(b, n)
        cos, sin = self.rotary(positions, inputs_embeds.dtype)
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, attn_mask)
        return self.norm(x)


class Qwen2CausalLMBody(nn.Module):
    """Stands where HF's ``Qwen2ForCausalLM`` stood (key prefix ``model.``), without its unused ``lm_head``."""

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.model = Qwen2Model(cfg)


class Qwen2Encoder(nn.Module):
    """Stands where CosyVoice's ``Qwen2Encoder`` stood: ``self.model`` is the (head-less) causal LM.

    Inside ``TextSpeechLM`` (attribute ``llm``) this yields the checkpoint's ``llm.model.model.*`` keys.
    """

    def __init__(self, cfg: Qwen2Config) -> None:
        super().__init__()
        self.model = Qwen2CausalLMBody(cfg)

    @property
    def body(self) -> Qwen2Model:
        return self.model.model

    @property
    def embed_tokens(self) -> nn.Embedding:
        """The Qwen text embedding (used for text ids in CosyVoice 2)."""
        return self.model.model.embed_tokens

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | list[KVCache] | PooledStep | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, n, hidden]`` -> last hidden state ``[B, n, hidden]`` (see ``Qwen2Model.forward``)."""
        return self.model.model(inputs_embeds, positions, cache, attn_mask)
