"""``VoxCPM2Model``: every network of ``model.safetensors`` with the release's state-dict names.

See docs/design.md, "VoxCPM 2 release files and configuration".

| attribute | role |
| --- | --- |
| ``base_lm`` | TSLM: MiniCPM-4 with the text embedding, causal, LongRoPE |
| ``residual_lm`` | RALM: MiniCPM-4 without embedding, causal, no RoPE in the release |
| ``feat_encoder`` | LocEnc (patch -> embedding) |
| ``feat_decoder`` | flow sampler around the LocDiT ``estimator`` |
| ``fsq_layer`` | FSQ bottleneck on TSLM outputs at audio positions |
| ``enc_to_lm_proj`` / ``lm_to_dit_proj`` / ``res_to_dit_proj`` / ``fusion_concat_proj`` | projections |
| ``stop_proj`` + SiLU + ``stop_head`` | stop predictor (logit 1 = stop) |

The AudioVAE is not part of this module (it lives in ``audio_vae*.py`` and always runs in float32); this model
maps text + latent patches to latent patches. The recurrence is in ``lm.py``, the loop in ``generate.py``.
All projections are plain ``nn.Linear`` (LoRA can replace them in place, keeping ``weight``/``bias`` names).
"""

from __future__ import annotations

import torch
from torch import nn

from cadenza.layers.fsq import ScalarQuantizer
from cadenza.models.voxcpm2.cfm import PatchFlowSampler
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.local_dit import LocalDiT
from cadenza.models.voxcpm2.local_encoder import LocalEncoder
from cadenza.models.voxcpm2.minicpm4 import MiniCPMModel

STOP_CLASSES = 2  # stop head logits: [continue, stop]


class VoxCPM2Model(nn.Module):
    def __init__(self, config: VoxCPM2Config) -> None:
        super().__init__()
        self.config = config
        lm = config.base_lm_config()
        hidden, enc_hidden, dit_hidden = lm.hidden_size, config.encoder_config.hidden_dim, config.dit_config.hidden_dim
        self.base_lm = MiniCPMModel(lm)
        self.residual_lm = MiniCPMModel(config.residual_lm_config())
        self.feat_encoder = LocalEncoder(config.encoder_lm_config(), input_dim=config.feat_dim)
        self.feat_decoder = PatchFlowSampler(
            LocalDiT(config.dit_lm_config(), in_channels=config.feat_dim), mean_mode=config.dit_config.dit_mean_mode
        )
        # round(z·s)/s is the same number for -s (rounding is odd-symmetric), so a negative scale, which the
        # reference accepts, is its absolute value here.
        self.fsq_layer = ScalarQuantizer(
            hidden, hidden, config.scalar_quantization_latent_dim, abs(config.scalar_quantization_scale)
        )
        self.enc_to_lm_proj = nn.Linear(enc_hidden, hidden)
        self.lm_to_dit_proj = nn.Linear(hidden, dit_hidden)
        self.res_to_dit_proj = nn.Linear(hidden, dit_hidden)
        self.fusion_concat_proj = nn.Linear(2 * hidden, hidden)
        self.stop_proj = nn.Linear(hidden, hidden)
        self.stop_actn = nn.SiLU()
        self.stop_head = nn.Linear(hidden, STOP_CLASSES, bias=False)

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    @property
    def feat_dim(self) -> int:
        return self.config.feat_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.stop_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.stop_head.weight.device

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``[B, T]`` -> ``[B, T, H]`` (times ``scale_emb`` under muP only)."""
        emb = self.base_lm.embed_tokens(ids)
        scale = self.config.lm_config.embedding_scale
        return emb * scale if scale != 1.0 else emb

    def embed_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """patches ``[B, T, P, D]`` -> LM-width embeddings ``[B, T, H]`` (LocEnc + ``enc_to_lm_proj``)."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def dit_condition(self, lm_hidden: torch.Tensor, residual_hidden: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` x 2 -> the DiT's two condition tokens, flattened ``[B, 2·Hd]``."""
        return torch.cat((self.lm_to_dit_proj(lm_hidden), self.res_to_dit_proj(residual_hidden)), dim=-1)

    def stop_logits(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., 2]``; argmax 1 means stop."""
        return self.stop_head(self.stop_actn(self.stop_proj(lm_hidden)))

    def sample_patch(
        self,
        mu: torch.Tensor,
        prev_patch: torch.Tensor,
        noise: torch.Tensor,
        n_timesteps: int = 10,
        cfg_value: float = 2.0,
        use_cfg_zero_star: bool = True,
    ) -> torch.Tensor:
        """mu ``[B, 2·Hd]``, prev_patch ``[B, P, D]``, noise ``[B, D, P]`` -> next patch ``[B, P, D]``."""
        out = self.feat_decoder(
            mu, prev_patch.transpose(1, 2), noise, n_timesteps=n_timesteps, cfg_value=cfg_value,
            use_cfg_zero_star=use_cfg_zero_star,
        )
        return out.transpose(1, 2)
