"""The flow-matching velocity estimator: Matcha-TTS's conditional 1-D U-Net, causal variant.

See docs/design.md, "CosyVoice 2 flow".

Inputs are stacked on the channel axis (``x``, ``mu``, the speaker vector broadcast over time, ``cond``), then:
down block(s) (resnet + transformer blocks + conv), mid blocks, up block(s) fed with the skip connection, a final
causal block and a 1x1 projection back to the mel bins. CosyVoice 2 uses a single level (``channels = [256]``),
so no time resampling happens; multi-level configs are built the way Matcha builds them.

Convolutions are always causal; attention is full (key padding only) or, with ``streaming=True``, chunk-causal
with ``static_chunk_size`` frames per chunk, so a prefix of the output does not depend on later frames.
That is what incremental inference uses: with a ``StreamCache`` the input frames continue a cached stream
(``cache.start`` frames before them) and every conv / attention layer continues from its cached state. Only the
single-level U-Net can do that (Matcha's down/up-samplers look ahead).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.masks import attention_mask, mask_to_bias
from cadenza.layers.per_sample_masks import per_sample_attention_mask
from cadenza.layers.stream_cache import RowStreamCaches, StreamCache
from cadenza.layers.timestep_embedding import SinusoidalTimeEmbedding, TimestepMLP
from cadenza.models.cosyvoice2.config import EstimatorConfig
from cadenza.models.cosyvoice2.flow_estimator_blocks import (
    CONV_KERNEL,
    BasicTransformerBlock,
    CausalBlock1D,
    CausalConv1d,
    CausalResnetBlock1D,
    ChunkCausalKeys,
    Downsample1D,
    Upsample1D,
)

TIME_EMBED_MULT = 4  # time-embedding width = 4 x the first U-Net channel count (Matcha)


class CausalConditionalDecoder(nn.Module):
    """``(x, mu, cond [B, mel, T], spks [B, mel], t [B], mask [B, 1, T]) -> velocity [B, mel, T]``."""

    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        channels = tuple(cfg.channels)
        self.static_chunk_size = cfg.static_chunk_size
        self.num_decoding_left_chunks = cfg.num_decoding_left_chunks
        time_embed_dim = channels[0] * TIME_EMBED_MULT
        self.time_embeddings = SinusoidalTimeEmbedding(cfg.in_channels, float32_frequencies=True)
        self.time_mlp = TimestepMLP(cfg.in_channels, time_embed_dim)

        def transformer_stack(dim: int) -> nn.ModuleList:
            return nn.ModuleList(
                BasicTransformerBlock(dim, cfg.num_heads, cfg.attention_head_dim) for _ in range(cfg.n_blocks)
            )

        self.down_blocks = nn.ModuleList()
        out_ch = cfg.in_channels
        for i, ch in enumerate(channels):
            in_ch, out_ch = out_ch, ch
            last = i == len(channels) - 1
            resample = CausalConv1d(out_ch, out_ch, CONV_KERNEL) if last else Downsample1D(out_ch)
            self.down_blocks.append(
                nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, time_embed_dim), transformer_stack(out_ch), resample])
            )

        self.mid_blocks = nn.ModuleList(
            nn.ModuleList([CausalResnetBlock1D(channels[-1], out_ch, time_embed_dim), transformer_stack(out_ch)])
            for _ in range(cfg.num_mid_blocks)
        )

        up_channels = channels[::-1] + (channels[0],)
        self.up_blocks = nn.ModuleList()
        for i in range(len(up_channels) - 1):
            in_ch, out_ch = up_channels[i] * 2, up_channels[i + 1]  # x2: concatenated skip connection
            last = i == len(up_channels) - 2
            resample = CausalConv1d(out_ch, out_ch, CONV_KERNEL) if last else Upsample1D(out_ch)
            self.up_blocks.append(
                nn.ModuleList([CausalResnetBlock1D(in_ch, out_ch, time_embed_dim), transformer_stack(out_ch), resample])
            )
        self.final_block = CausalBlock1D(up_channels[-1], up_channels[-1])
        self.final_proj = nn.Conv1d(up_channels[-1], cfg.out_channels, 1)

    @property
    def supports_cache(self) -> bool:
        """Incremental inference needs causal resampling, i.e. a single-level U-Net (CosyVoice 2's)."""
        return len(self.down_blocks) == 1

    def attention_bias(
        self, mask: torch.Tensor, streaming: bool, dtype: torch.dtype, past: int = 0,
        chunk_sizes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """mask ``[B, 1, T]`` (float or bool) -> additive bias ``[B, 1, 1 or T, K]`` for every head.

        ``past`` cached frames (all valid) precede the T frames; the bias then covers the last ``K <= past + T`` keys:
        with a limited left context (``num_decoding_left_chunks >= 0``) keys that no new query may see are left out,
        so attention cost stays bounded. ``chunk_sizes [B]`` (training, no past): each row's chunk in frames.
        """
        if chunk_sizes is not None:
            allowed = per_sample_attention_mask(mask.bool(), chunk_sizes, self.num_decoding_left_chunks)
            return mask_to_bias(allowed, dtype).unsqueeze(1)
        chunk = self.static_chunk_size if streaming else 0
        keys = mask.bool()
        if past:
            keys = torch.cat([keys.new_ones(keys.size(0), 1, past), keys], dim=2)
        allowed = attention_mask(keys, chunk, self.num_decoding_left_chunks, query_start=past)
        if past and chunk and self.num_decoding_left_chunks >= 0:
            allowed = allowed[..., max(0, (past // chunk - self.num_decoding_left_chunks) * chunk) :]
        return mask_to_bias(allowed, dtype).unsqueeze(1)

    def _unmasked_chunks(self, mask: torch.Tensor) -> bool:
        """Whether an incremental call's attention is plain chunk-causal: all left chunks visible (the released
        config), a chunk size, and no padded frame."""
        return self.num_decoding_left_chunks < 0 and self.static_chunk_size > 0 and bool(mask.all())

    @staticmethod
    def _transformers(
        h: torch.Tensor, blocks: nn.ModuleList, bias: torch.Tensor, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """Run a transformer stack on ``[B, C, T]`` (the blocks work on ``[B, T, C]``)."""
        h = h.transpose(1, 2).contiguous()
        for block in blocks:
            h = block(h, bias, cache)
        return h.transpose(1, 2).contiguous()

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor | None = None,
        cond: torch.Tensor | None = None,
        streaming: bool = False,
        cache: StreamCache | RowStreamCaches | None = None,
        chunk_sizes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x, mu, cond ``[B, mel, T]``; mask ``[B, 1, T]`` (1 = valid frame); t ``[B]``; spks ``[B, mel]``; cache:
        the T frames follow ``cache.start`` cached ones (needs ``streaming``), ``cache.commit`` of them are kept
        (``RowStreamCaches``: per stream, batch rows split as it says);
        chunk_sizes ``[B]`` (training with mixed masks): each row's attention chunk in frames (0 = full, 1 = causal)
        instead of ``streaming``.

        Returns the predicted velocity ``[B, out_channels, T]`` (zero on masked frames).
        """
        if cache is not None and (chunk_sizes is not None or not (streaming and self.supports_cache)):
            raise ValueError("an incremental estimator call needs streaming=True and a single-level U-Net")
        # The sinusoidal table from t as given (float32 t keeps its precision), then the MLP's dtype.
        temb = self.time_mlp(self.time_embeddings(t).to(self.time_mlp.linear_1.weight.dtype))
        parts = [x, mu]
        if spks is not None:
            parts.append(spks.unsqueeze(-1).expand(-1, -1, x.size(-1)))
        if cond is not None:
            parts.append(cond)
        h = torch.cat(parts, dim=1)
        biases: dict[int, torch.Tensor] = {}  # one attention bias per U-Net level, shared by its stacks

        def bias_for(level_mask: torch.Tensor) -> torch.Tensor | list[torch.Tensor] | ChunkCausalKeys | list:
            if id(level_mask) not in biases:
                if cache is not None and self._unmasked_chunks(level_mask):  # see ChunkCausalKeys
                    caches = cache.caches if isinstance(cache, RowStreamCaches) else [cache]
                    plans = [ChunkCausalKeys.plan(c.start, level_mask.size(-1), self.static_chunk_size) for c in caches]
                    biases[id(level_mask)] = plans if isinstance(cache, RowStreamCaches) else plans[0]
                elif isinstance(cache, RowStreamCaches):  # one bias per stream: their cached lengths differ
                    biases[id(level_mask)] = [
                        self.attention_bias(m, streaming, x.dtype, c.start)
                        for c, m in zip(cache.caches, cache.split(level_mask))
                    ]
                else:
                    past = 0 if cache is None else cache.start
                    biases[id(level_mask)] = self.attention_bias(level_mask, streaming, x.dtype, past, chunk_sizes)
            return biases[id(level_mask)]

        hiddens, masks = [], [mask]
        for resnet, blocks, downsample in self.down_blocks:
            mask_down = masks[-1]
            h = resnet(h, mask_down, temb, cache)
            h = self._transformers(h, blocks, bias_for(mask_down), cache)
            hiddens.append(h)
            h = downsample(h * mask_down, cache)
            masks.append(mask_down[:, :, ::2])
        masks = masks[:-1]
        mask_mid = masks[-1]

        for resnet, blocks in self.mid_blocks:
            h = resnet(h, mask_mid, temb, cache)
            h = self._transformers(h, blocks, bias_for(mask_mid), cache)

        mask_up = mask
        for resnet, blocks, upsample in self.up_blocks:
            mask_up = masks.pop()
            skip = hiddens.pop()
            h = torch.cat([h[:, :, : skip.size(-1)], skip], dim=1)
            h = resnet(h, mask_up, temb, cache)
            h = self._transformers(h, blocks, bias_for(mask_up), cache)
            h = upsample(h * mask_up, cache)
        h = self.final_block(h, mask_up, cache)
        return self.final_proj(h * mask_up) * mask
