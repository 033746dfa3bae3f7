"""Speech tokens -> mel: the CosyVoice 2 flow (``CausalMaskedDiffWithXvec``; docs/design.md, "CosyVoice 2 flow").

``TokenToMelFlow`` embeds prompt + target tokens, encodes them to ``token_mel_ratio`` frames per token, projects
to mel-sized ``mu`` and samples the mel with conditional flow matching, conditioned on ``mu``, the projected
speaker x-vector and the prompt mel (placed in the first frames of ``cond``). The prompt frames are dropped from
the output. Submodule names equal the released ``flow.pt`` keys, so ``load_state_dict(strict=True)`` works.

``encode_tokens`` and ``prompt_condition`` are shared with the incremental streaming path
(``flow_incremental.IncrementalFlow``), which runs the same modules chunk by chunk with caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import InputError
from cadenza.layers.embedding import Embedding
from cadenza.layers.stream_cache import StreamCache
from cadenza.models.cosyvoice2.cfm import ConditionalFlowMatching
from cadenza.models.cosyvoice2.config import FlowConfig
from cadenza.models.cosyvoice2.flow_encoder import UpsampleConformerEncoder
from cadenza.models.cosyvoice2.flow_estimator import CausalConditionalDecoder
from cadenza.models.cosyvoice2.flow_rate import FrameRate


class TokenToMelFlow(nn.Module):
    """``inference(token, prompt_token, prompt_feat, embedding, streaming, finalize) -> mel [1, mel, frames]``."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.encoder)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = ConditionalFlowMatching(cfg.cfm, CausalConditionalDecoder(cfg.estimator), cfg.output_size)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the encoder and the CFM estimator compute in (float32 unless ``set_compute_dtype`` changed it).
        Everything around them (token/speaker embeddings, projections, the ODE state, the output) stays float32."""
        return self.encoder.embed.out[0].weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """Run the encoder and the CFM estimator (nearly all of the flow's work) in ``dtype``: their weights are
        cast in place (one way: float32 weights are not kept)."""
        self.encoder.to(dtype)
        self.decoder.set_compute_dtype(dtype)

    def speaker_projection(self, embedding: torch.Tensor) -> torch.Tensor:
        """Raw x-vector ``[B, spk_embed_dim]`` -> L2-normalised and projected ``[B, mel]``."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def encode(self, tokens: torch.Tensor, finalize: bool, streaming: bool) -> torch.Tensor:
        """tokens ``[1, T]`` (prompt + target) -> ``mu [1, mel, ratio * T']`` with ``T' = T`` if ``finalize`` else
        ``T - pre_lookahead_len`` (the last tokens then only serve as look-ahead context)."""
        n = tokens.size(1) - (0 if finalize else self.cfg.pre_lookahead_len)
        return self.encode_tokens(tokens[:, :n], tokens[:, n:], streaming)

    def encode_tokens(
        self, tokens: torch.Tensor, context: torch.Tensor, streaming: bool, cache: StreamCache | None = None
    ) -> torch.Tensor:
        """tokens ``[1, T]`` -> ``mu [1, mel, ratio * T]``; context ``[1, <= pre_lookahead_len]`` look-ahead tokens
        (may be empty: zeros are used); cache: the tokens continue a cached stream (see the encoder)."""
        x = self.input_embedding(torch.clamp(tokens, min=0))
        ctx = self.input_embedding(torch.clamp(context, min=0)) if context.size(1) else None
        dtype = self.compute_dtype
        if dtype != x.dtype:  # a lower-precision encoder (CPU fast path): its input cast in, its output back out
            h, _ = self.encoder(x.to(dtype), context=None if ctx is None else ctx.to(dtype), streaming=streaming,
                                cache=cache)
            h = h.to(x.dtype)
        else:
            h, _ = self.encoder(x, context=ctx, streaming=streaming, cache=cache)
        return self.encoder_proj(h).transpose(1, 2).contiguous()

    def prompt_condition(self, prompt_feat: torch.Tensor, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
        """``cond [1, mel, end - start]`` for frames ``start .. end-1``: the prompt mel ``[1, P_mel, mel]`` on its
        frames, zeros after (device/dtype of ``like``)."""
        cond = torch.zeros(1, end - start, self.cfg.output_size, device=like.device, dtype=like.dtype)
        if start < prompt_feat.size(1):
            cond[:, : prompt_feat.size(1) - start] = prompt_feat[:, start:end]
        return cond.transpose(1, 2)

    @torch.inference_mode()
    def inference(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        streaming: bool = False,
        finalize: bool = True,
        speed: float = 1.0,
    ) -> torch.Tensor:
        """Generate the mel of ``token``.

        Args:
            token: ``[1, T]`` int speech tokens to synthesise.
            prompt_token: ``[1, P]`` int prompt speech tokens (``P`` may be 0).
            prompt_feat: ``[1, P_mel, mel]`` prompt mel (frames x bins), normally ``P_mel = ratio * P``.
            embedding: ``[1, spk_embed_dim]`` raw speaker x-vector.
            streaming: chunk-causal attention in encoder and estimator (same frames as a longer call would give).
            finalize: False when more tokens will follow: the last ``pre_lookahead_len`` tokens are then look-ahead
                context only and produce no frames.
            speed: speaking rate of the tokens after the prompt (``flow_rate.FrameRate``: ``mu`` resampled to
                ``1 / speed`` as many frames; a flow trained on speaking-rate pairs renders them well).

        Returns:
            mel ``[1, mel, ratio * (P + T') - P_mel]`` float32 with ``T' = T`` (finalize) or
            ``T - pre_lookahead_len``; at ``speed`` != 1 the frames after the prompt number ``FrameRate.total``
            (finalize) or ``FrameRate.ready`` of theirs.
        """
        self._check_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        weight = self.spk_embed_affine_layer.weight
        spks = self.speaker_projection(embedding.to(device=weight.device, dtype=weight.dtype))
        tokens = torch.cat([prompt_token, token], dim=1).to(device=weight.device, dtype=torch.long)
        mu = self.encode(tokens, finalize, streaming)
        prompt_frames, total = prompt_feat.size(1), mu.size(2)
        if prompt_frames > total:
            raise InputError(f"prompt mel has {prompt_frames} frames but prompt + tokens only give {total}")
        if speed != 1.0:
            rate = FrameRate(speed, prompt_frames)
            total = rate.frames(total, finalize)
            mu = rate.resample(mu, 0, 0, total, mu.size(2))
        cond = self.prompt_condition(prompt_feat, 0, total, mu)
        mask = torch.ones(1, 1, total, device=mu.device, dtype=mu.dtype)
        mel = self.decoder(mu, mask, spks, cond, streaming=streaming)
        return mel[:, :, prompt_frames:].float()

    def _check_inputs(self, token, prompt_token, prompt_feat, embedding, finalize: bool) -> None:
        self.check_prompt(prompt_token, prompt_feat, embedding)
        self.check_tokens(token, "token")
        n_tokens = token.size(1) + prompt_token.size(1)
        if n_tokens == 0 or (not finalize and n_tokens <= self.cfg.pre_lookahead_len):
            raise InputError(f"not enough speech tokens ({n_tokens}) for a flow call (finalize={finalize})")

    def check_prompt(self, prompt_token, prompt_feat, embedding) -> None:
        """Raise ``InputError`` unless prompt_token ``[1, P]`` int, prompt_feat ``[1, frames, mel]`` and embedding
        ``[1, spk_embed_dim]`` are usable."""
        self.check_tokens(prompt_token, "prompt_token")
        if prompt_feat.dim() != 3 or prompt_feat.size(0) != 1 or prompt_feat.size(2) != self.cfg.output_size:
            raise InputError(f"prompt_feat must be [1, frames, {self.cfg.output_size}], got {tuple(prompt_feat.shape)}")
        if embedding.dim() != 2 or embedding.shape != (1, self.cfg.spk_embed_dim):
            raise InputError(f"embedding must be [1, {self.cfg.spk_embed_dim}], got {tuple(embedding.shape)}")

    def check_tokens(self, ids, name: str) -> None:
        """Raise ``InputError`` unless ``ids`` is a ``[1, n]`` integer tensor of ids < vocab_size."""
        if ids.dim() != 2 or ids.size(0) != 1:
            raise InputError(f"{name} must be a [1, T] tensor (batch size 1), got {tuple(ids.shape)}")
        if ids.numel() and ids.dtype.is_floating_point:
            raise InputError(f"{name} must be integer speech tokens")
        if ids.numel() and int(ids.max()) >= self.cfg.vocab_size:
            raise InputError(f"{name} contains ids >= vocab_size {self.cfg.vocab_size}")
