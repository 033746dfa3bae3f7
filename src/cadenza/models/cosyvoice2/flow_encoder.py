"""The flow's text-side encoder: ``UpsampleConformerEncoder`` (docs/design.md, "CosyVoice 2 flow").

tokens embeddings ``[B, T, d]`` -> Linear/LayerNorm/rel-pos embed -> look-ahead convolution -> conformer blocks
-> x``stride`` causal upsampling -> second embed -> more conformer blocks -> LayerNorm -> ``[B, stride*T, d]``.

Streaming: with ``streaming=True`` every attention uses a chunk mask (``static_chunk_size`` tokens in the first
stack, ``stride`` times that in the second) and all convolutions are causal, so outputs for earlier chunks do not
depend on later tokens. The only look-ahead is ``PreLookaheadLayer``'s ``pre_lookahead_len`` tokens, which a
streaming caller passes as ``context`` (tokens that are seen but produce no output frames).

Incremental: with a ``StreamCache`` the input is only the tokens after the cached ones (``cache.start`` of them);
every layer continues from its cached state (look-ahead history, attention keys/values and projected positions,
upsampler tail) and keeps the state of the first ``cache.commit`` tokens (complete chunks) for the next call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.layers.conformer import ConformerBlock
from cadenza.layers.masks import attention_mask, padding_mask
from cadenza.layers.per_sample_masks import per_sample_attention_mask
from cadenza.layers.positional import EspnetRelPositionalEncoding
from cadenza.layers.stream_cache import StreamCache
from cadenza.models.cosyvoice2.config import FlowEncoderConfig

EMBED_LAYER_NORM_EPS = 1e-5
LOOKAHEAD_SECOND_KERNEL = 3  # PreLookaheadLayer.conv2 (causal)


class LinearEmbed(nn.Module):
    """``Linear -> LayerNorm -> x * sqrt(d)`` plus the relative position table (ESPnet ``LinearNoSubsampling``).

    ``out.0`` / ``out.1`` are the checkpoint names; the reference's dropout at ``out.2`` has no parameters.
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim, eps=EMBED_LAYER_NORM_EPS))
        self.pos_enc = EspnetRelPositionalEncoding(out_dim)

    def forward(self, x: torch.Tensor, past: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, in_dim]`` -> (``[B, T, out_dim]``, pos_emb ``[1, past + 2T - 1, out_dim]``); ``past`` = cached
        positions before x (their keys need the larger relative positions)."""
        return self.pos_enc(self.out(x), past=past)

    def embed_only(self, x: torch.Tensor) -> torch.Tensor:
        """Same transform without positions (used for look-ahead context tokens)."""
        return self.out(x) * self.pos_enc.xscale


class PreLookaheadLayer(nn.Module):
    """Residual look-ahead: ``x + conv2(causal_pad(leaky_relu(conv1(right_pad(x)))))`` on ``[B, T, C]``.

    ``conv1`` (kernel ``lookahead + 1``) sees each frame and the ``lookahead`` frames after it: zeros at the end
    of the input, or the real ``context`` frames when streaming.
    """

    def __init__(self, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=LOOKAHEAD_SECOND_KERNEL)

    def forward(
        self, inputs: torch.Tensor, context: torch.Tensor | None = None, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """inputs ``[B, T, C]``, context ``[B, Tc <= lookahead, C]`` or None -> ``[B, T, C]``.

        With ``cache`` the inputs continue the cached stream: ``conv2`` needs ``conv1`` outputs of the frames
        before them, so the last committed input frames are prepended (``conv1`` only sees real frames there).
        """
        x = inputs.transpose(1, 2).contiguous()
        history = 0
        if cache is not None:
            x = cache.left_context(self, x, self.conv2.kernel_size[0] - 1, zero_fill=False)
            history = x.size(2) - inputs.size(1)
        if context is not None and context.size(1) > 0:
            if context.size(1) > self.lookahead:
                raise ValueError(f"at most {self.lookahead} context frames, got {context.size(1)}")
            x = torch.cat([x, context.transpose(1, 2).contiguous()], dim=2)
            x = F.pad(x, (0, self.lookahead - context.size(1)), value=0.0)
        else:
            x = F.pad(x, (0, self.lookahead), value=0.0)
        x = F.leaky_relu(self.conv1(x))
        x = F.pad(x, (self.conv2.kernel_size[0] - 1 - history, 0), value=0.0)
        x = self.conv2(x).transpose(1, 2).contiguous()
        return x + inputs


class CausalUpsample1D(nn.Module):
    """Causal x``stride`` upsampling ``[B, C, T] -> [B, C, stride*T]``.

    Nearest-neighbour repeat in time, left-pad ``2*stride`` zeros, Conv1d with kernel ``2*stride + 1``.
    """

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, kernel_size=2 * stride + 1)

    def forward(self, x: torch.Tensor, cache: StreamCache | None = None) -> torch.Tensor:
        """x ``[B, C, T]`` -> ``[B, C, stride*T]``; ``cache`` (at the output rate) continues a stream."""
        x = torch.repeat_interleave(x, self.stride, dim=2)  # == F.interpolate(mode="nearest"), exactly
        if cache is None:
            return self.conv(F.pad(x, (2 * self.stride, 0), value=0.0))
        return self.conv(cache.left_context(self, x, 2 * self.stride))


class UpsampleConformerEncoder(nn.Module):
    """Speech-token embeddings ``[B, T, input_size]`` -> hidden states ``[B, stride*T, output_size]``."""

    def __init__(self, cfg: FlowEncoderConfig) -> None:
        super().__init__()
        d = cfg.output_size
        self.static_chunk_size = cfg.static_chunk_size
        # Registration order follows the reference so that state-dict key order matches the checkpoint.
        self.embed = LinearEmbed(cfg.input_size, d)
        self.after_norm = nn.LayerNorm(d, eps=EMBED_LAYER_NORM_EPS)
        self.pre_lookahead_layer = PreLookaheadLayer(d, cfg.pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerBlock(d, cfg.attention_heads, cfg.linear_units) for _ in range(cfg.num_blocks)
        )
        self.up_layer = CausalUpsample1D(d, cfg.upsample_stride)
        self.up_embed = LinearEmbed(d, d)
        self.up_encoders = nn.ModuleList(
            ConformerBlock(d, cfg.attention_heads, cfg.linear_units) for _ in range(cfg.num_up_blocks)
        )

    def forward(
        self,
        xs: torch.Tensor,
        xs_lens: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        streaming: bool = False,
        cache: StreamCache | None = None,
        chunk_sizes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """xs ``[B, T, input_size]``; xs_lens ``[B]`` (None = all T valid); context ``[B, <=lookahead, input_size]``
        look-ahead embeddings that follow xs (inference only); cache: continue a stream (needs ``streaming``, no
        xs_lens): xs are the tokens after the ``cache.start`` cached ones, ``cache.commit`` of them become cached.
        chunk_sizes ``[B]`` (training with mixed masks): each row's attention chunk in tokens (0 = full attention,
        1 = causal; the second stack uses ``stride`` times it), instead of ``streaming``.

        Returns (``[B, stride*T, output_size]``, key padding mask bool ``[B, 1, stride*T]``).
        """
        batch, length = xs.size(0), xs.size(1)
        past = 0
        if cache is not None:
            if not streaming or xs_lens is not None or chunk_sizes is not None:
                raise ValueError("an incremental encoder call needs streaming=True (chunk masks) and no xs_lens")
            past = cache.start
        padded = xs_lens is not None
        if xs_lens is None:
            xs_lens = torch.full((batch,), past + length, dtype=torch.long, device=xs.device)
        key_mask = padding_mask(xs_lens, past + length)
        xs, pos_emb = self.embed(xs, past)
        if padded:
            # Padding positions become zeros, as past the end of one utterance at inference; otherwise the
            # look-ahead convolution of the last real tokens reads padding embeddings (the reference's training does).
            xs = xs * key_mask.transpose(1, 2).to(xs.dtype)
        if context is not None and context.size(1) > 0:
            context = self.embed_context(context)
        if chunk_sizes is not None:
            mask = per_sample_attention_mask(key_mask, chunk_sizes)
        else:
            mask = attention_mask(key_mask, self.static_chunk_size if streaming else 0, query_start=past)
        xs = self.pre_lookahead_layer(xs, context, cache)
        for layer in self.encoders:
            xs = layer(xs, mask, pos_emb, cache)

        stride = self.up_layer.stride
        up_cache = None if cache is None else cache.scaled(stride)
        xs = self.up_layer(xs.transpose(1, 2).contiguous(), up_cache).transpose(1, 2).contiguous()
        key_mask = padding_mask(xs_lens * stride, stride * (past + length))
        xs, pos_emb = self.up_embed(xs, stride * past)
        if chunk_sizes is not None:
            mask = per_sample_attention_mask(key_mask, chunk_sizes * stride)
        else:
            mask = attention_mask(key_mask, self.static_chunk_size * stride if streaming else 0, query_start=stride * past)
        for layer in self.up_encoders:
            xs = layer(xs, mask, pos_emb, up_cache)
        return self.after_norm(xs), key_mask[:, :, stride * past :]

    def embed_context(self, context: torch.Tensor) -> torch.Tensor:
        """Look-ahead tokens go through the same input embedding; their positions are never used."""
        return self.embed.embed_only(context)
