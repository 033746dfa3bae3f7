"""The flow's training forward (docs/training.md, "Stage flow"): tokens + prompt mel + x-vector -> CFM loss.

``FlowForTraining.forward`` runs, inside one module call (what DDP wraps), the token embedding (padding zeroed),
the encoder with each row's attention chunk, the projection to ``mu``, the speaker projection and
``ConditionalFlowMatching.compute_loss`` with per-row draws. ``cond`` holds the first ``prompt_len`` mel frames of
each row (the prompt, as at inference) and the loss covers the frames after them (or all valid frames with
``loss_on_prompt``, the reference's choice).

Speaking-rate pairs (``frame_lens``, docs/controls.md "Speed"): a row whose mel is read faster or slower than its
tokens' own timeline has its ``mu`` (``ratio`` frames per token) resampled linearly to the mel's frame count — the
same resampling the engine applies for ``speed`` with ``speed_method="flow"`` — so the estimator learns to render
a condition at another rate instead of blurring it.

Attention mask kinds (the CosyVoice 2 paper's four; docs/training.md, "Stage flow"), one per row: ``full`` (non-causal),
``causal`` (full-causal: a frame sees only the past), ``chunk`` (chunk-M: the config's static chunk sizes, 25 tokens /
50 frames) and ``chunk2`` (chunk-2M). Training on all four lets one model serve offline and streaming inference at
different latencies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import InputError
from cadenza.layers.masks import padding_mask
from cadenza.models.cosyvoice2.flow import TokenToMelFlow

MASK_KINDS = ("full", "causal", "chunk", "chunk2")


def chunk_sizes(kind: str, token_chunk: int, frame_chunk: int) -> tuple[int, int]:
    """(encoder chunk in tokens, estimator chunk in frames) of a mask kind; 0 = full attention."""
    table = {"full": (0, 0), "causal": (1, 1), "chunk": (token_chunk, frame_chunk),
             "chunk2": (2 * token_chunk, 2 * frame_chunk)}
    if kind not in table:
        raise InputError(f"unknown attention mask kind {kind!r}; choose from {MASK_KINDS}")
    return table[kind]


class FlowForTraining(nn.Module):
    """``prior_weight`` > 0 adds ``prior_weight x`` the mean squared error between the encoder's ``mu`` and the
    target mel on the loss frames (Grad-TTS / Matcha-TTS's encoder loss; not in CosyVoice 2). It supervises the
    token -> mel mapping directly instead of only through the decoder's vector field: with a new token vocabulary
    the flow otherwise learns what each token sounds like slowly (cadenza-tiny v2, docs/cadenza-tiny.md). ``mu``
    stays a conditioning input of the decoder, so inference is unchanged."""

    def __init__(self, flow: TokenToMelFlow, loss_on_prompt: bool = False, prior_weight: float = 0.0) -> None:
        super().__init__()
        self.flow = flow
        self.loss_on_prompt = loss_on_prompt
        self.prior_weight = prior_weight

    def forward(
        self,
        tokens: torch.Tensor,
        token_lens: torch.Tensor,
        mel: torch.Tensor,
        spk: torch.Tensor,
        prompt_lens: torch.Tensor,
        enc_chunks: torch.Tensor,
        est_chunks: torch.Tensor,
        t: torch.Tensor,
        z: torch.Tensor,
        cfg_keep: torch.Tensor,
        frame_lens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens ``[B, T]`` (padded), token_lens ``[B]``, mel ``[B, mel, F]`` (padded with zeros; ``F = ratio*T``
        without ``frame_lens``), spk ``[B, spk_dim]``, prompt_lens ``[B]`` (frames), enc/est_chunks ``[B]``, t
        ``[B]``, z like mel, cfg_keep ``[B]`` bool, frame_lens ``[B]`` (optional: each row's mel frames, where they
        differ from ``ratio x`` its tokens ``mu`` is resampled to them) -> (loss averaged over this batch's loss
        frames x mel bins, number of loss frames)."""
        flow = self.flow
        token_mask = padding_mask(token_lens, tokens.size(1)).transpose(1, 2)  # [B, T, 1]
        x = flow.input_embedding(tokens.clamp(min=0)) * token_mask.to(flow.input_embedding.weight.dtype)
        h, h_mask = flow.encoder(x, token_lens, chunk_sizes=enc_chunks)
        mu = flow.encoder_proj(h).transpose(1, 2).contiguous()
        if frame_lens is not None:
            mu, h_mask = self._at_frame_lens(mu, token_lens, frame_lens, mel.size(2))
        if mu.shape != mel.shape:
            raise InputError(f"mel {tuple(mel.shape)} does not match the encoder output {tuple(mu.shape)}")
        mask = h_mask.to(mu.dtype)  # [B, 1, frames]
        frames = torch.arange(mel.size(2), device=mel.device)
        in_prompt = (frames[None, :] < prompt_lens[:, None]).unsqueeze(1)  # [B, 1, frames]
        cond = mel * in_prompt.to(mel.dtype)
        loss_mask = mask if self.loss_on_prompt else mask * (~in_prompt).to(mask.dtype)
        loss, _ = flow.decoder.compute_loss(
            mel, mask, mu, flow.speaker_projection(spk), cond,
            loss_mask=loss_mask, chunk_sizes=est_chunks, t=t, z=z, cfg_keep=cfg_keep,
        )
        if self.prior_weight > 0:
            prior = ((mu.float() - mel.float()) ** 2 * loss_mask).sum() / (loss_mask.sum() * mel.size(1)).clamp_min(1)
            loss = loss + self.prior_weight * prior
        return loss, loss_mask.sum()

    def _at_frame_lens(self, mu: torch.Tensor, token_lens: torch.Tensor, frame_lens: torch.Tensor,
                       frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """mu ``[B, mel, ratio*T]`` -> ``[B, mel, frames]``: row ``i``'s first ``ratio * token_lens[i]`` frames
        resampled (linear, half-pixel centres, as the engine's ``FrameRate``, with the scale taken from the two
        lengths: training rates may lie outside the engine's 0.5-2) to ``frame_lens[i]``; the mask of those frames."""
        ratio = self.flow.cfg.token_mel_ratio
        out = mu.new_zeros(mu.size(0), mu.size(1), frames)
        for i, (n, f) in enumerate(zip((token_lens * ratio).tolist(), frame_lens.tolist(), strict=True)):
            row = mu[i: i + 1, :, :n]
            out[i, :, :f] = (row if f == n else F.interpolate(row, size=f, mode="linear", align_corners=False))[0]
        return out, padding_mask(frame_lens.to(mu.device), frames)
