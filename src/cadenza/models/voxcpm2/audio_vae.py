"""VoxCPM 2's AudioVAE V2: 16 kHz waveform <-> 64-dim latents at 25 Hz <-> 48 kHz waveform.

See docs/design.md, "VoxCPM 2 AudioVAE".

Public entry points:

* :meth:`AudioVAE.encode` ``wav [B, N]`` (16 kHz) -> ``latents [B, D, ceil(N / 640)]`` (the encoder mean);
* :meth:`AudioVAE.decode` ``latents [B, D, T]`` -> ``wav [B, 1, 1920 T]`` at 48 kHz (tanh-bounded);
* :meth:`AudioVAE.decode` with a ``ConvStreamState``: what
  :class:`~cadenza.models.voxcpm2.audio_vae_streaming.StreamingAudioVAEDecoder` (in its own file; the model does not
  know its streaming wrapper) builds on to decode chunk by chunk, each latent frame exactly once.

Inputs are moved to the module's device and dtype; the reference always runs the VAE in float32 (latents from a
bf16 LM are cast up). Bad shapes raise :class:`~cadenza.errors.InputError` naming the expected layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import AudioError, InputError
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.audio_vae_conv import ConvStreamState
from cadenza.models.voxcpm2.audio_vae_decoder import AudioVAEDecoder
from cadenza.models.voxcpm2.audio_vae_encoder import AudioVAEEncoder


class AudioVAE(nn.Module):
    """Encoder + decoder; state-dict names equal the release's ``audiovae.pth`` after weight-norm folding.

    Args:
        cfg: hyper-parameters (:meth:`AudioVAEConfig.official` for the release).
    """

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = AudioVAEEncoder(cfg)
        self.decoder = AudioVAEDecoder(cfg)

    # ---------------------------------------------------------------- sizes

    @property
    def sample_rate(self) -> int:
        """Encoder input rate (16000)."""
        return self.cfg.sample_rate

    @property
    def out_sample_rate(self) -> int:
        """Decoder output rate (48000)."""
        return self.cfg.out_sample_rate

    @property
    def latent_dim(self) -> int:
        return self.cfg.latent_dim

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (640)."""
        return self.cfg.hop_length

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame (1920)."""
        return self.cfg.decode_hop_length

    def _device_dtype(self) -> tuple[torch.device, torch.dtype]:
        p = next(self.parameters())
        return p.device, p.dtype

    # ---------------------------------------------------------------- encoder

    def prepare_waveform(self, wav: torch.Tensor, sample_rate: int | None = None) -> torch.Tensor:
        """Validate ``[B, N]`` / ``[B, 1, N]`` audio at ``sample_rate`` and right-pad it to a multiple of the hop.

        Returns:
            ``[B, 1, hop_length * ceil(N / hop_length)]`` on the module's device and dtype.
        """
        if sample_rate is not None and sample_rate != self.sample_rate:
            raise InputError(f"the AudioVAE encoder takes {self.sample_rate} Hz audio, got {sample_rate} Hz: "
                             "resample it first")
        if not isinstance(wav, torch.Tensor):
            raise InputError(f"audio must be a torch.Tensor [B, N], got {type(wav).__name__}")
        if wav.dim() == 3 and wav.shape[1] == 1:
            wav = wav[:, 0]
        if wav.dim() != 2:
            raise InputError(f"audio must be [B, N] or [B, 1, N] (mono), got shape {tuple(wav.shape)}")
        if wav.shape[0] == 0 or wav.shape[1] == 0:
            raise InputError(f"audio is empty (shape {tuple(wav.shape)})")
        if not (wav.is_floating_point()):
            raise InputError(f"audio must be a floating-point waveform in [-1, 1], got dtype {wav.dtype}")
        device, dtype = self._device_dtype()
        wav = wav.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(wav).all()):
            raise AudioError("audio contains NaN or infinite samples")
        right_pad = -wav.shape[-1] % self.hop_length
        return F.pad(wav, (0, right_pad)).unsqueeze(1)

    def encode(self, wav: torch.Tensor, sample_rate: int | None = None) -> torch.Tensor:
        """Waveform -> latents (the encoder mean; no sampling).

        Args:
            wav: ``[B, N]`` or ``[B, 1, N]`` float audio at :attr:`sample_rate`; right-padded with zeros to a
                multiple of :attr:`hop_length`.
            sample_rate: rate of ``wav``; must equal :attr:`sample_rate` when given.

        Returns:
            ``[B, latent_dim, ceil(N / hop_length)]``.
        """
        return self.encoder(self.prepare_waveform(wav, sample_rate))

    def encode_mu_logvar(self, wav: torch.Tensor, sample_rate: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Both encoder heads (mean, log-variance), each ``[B, latent_dim, ceil(N / hop_length)]``."""
        return self.encoder.mu_logvar(self.prepare_waveform(wav, sample_rate))

    # ---------------------------------------------------------------- decoder

    def check_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Validate ``[B, latent_dim, T]`` latents and move them to the module's device and dtype."""
        if not isinstance(latents, torch.Tensor):
            raise InputError(f"latents must be a torch.Tensor [B, {self.latent_dim}, T], got {type(latents).__name__}")
        if latents.dim() != 3:
            raise InputError(f"latents must be [B, {self.latent_dim}, T] (channels first), got shape "
                             f"{tuple(latents.shape)}")
        if latents.shape[1] != self.latent_dim:
            hint = " (did you pass [B, T, D]? transpose the last two dims)" if latents.shape[2] == self.latent_dim else ""
            raise InputError(f"latents must have {self.latent_dim} channels at dim 1 ([B, D, T]), got shape "
                             f"{tuple(latents.shape)}{hint}")
        if latents.shape[0] == 0 or latents.shape[2] == 0:
            raise InputError(f"latents are empty (shape {tuple(latents.shape)}): need at least one frame")
        if not latents.is_floating_point():
            raise InputError(f"latents must be floating point, got dtype {latents.dtype}")
        device, dtype = self._device_dtype()
        return latents.to(device=device, dtype=dtype)

    def sr_bucket(self, sr_cond: int | torch.Tensor | None, batch: int) -> torch.Tensor | None:
        """Sample-rate condition -> FiLM bucket indices ``[1]`` or ``[B]`` (``None`` when the config has no FiLM).

        Args:
            sr_cond: output rate to condition on (Hz): an int, an int tensor ``[1]`` / ``[B]``, or ``None`` for
                :attr:`out_sample_rate`. It only selects a timbre bucket: the output always has
                :attr:`decode_hop_length` samples per frame.
        """
        if self.decoder.sr_bin_boundaries is None:
            return None
        device = self.decoder.sr_bin_boundaries.device
        if sr_cond is None:
            sr_cond = self.out_sample_rate
        if isinstance(sr_cond, bool) or not isinstance(sr_cond, (int, torch.Tensor)):
            raise InputError(f"sr_cond must be an int sample rate or an int tensor, got {type(sr_cond).__name__}")
        if isinstance(sr_cond, int):
            sr = torch.tensor([sr_cond], dtype=torch.int32, device=device)
        else:
            if sr_cond.is_floating_point() or sr_cond.dim() != 1 or sr_cond.shape[0] not in (1, batch):
                raise InputError(f"sr_cond tensor must be integer [1] or [{batch}], got {sr_cond.dtype} "
                                 f"{tuple(sr_cond.shape)}")
            sr = sr_cond.to(device)
        if bool((sr <= 0).any()):
            raise InputError(f"sr_cond must be positive sample rates, got {sr.tolist()}")
        return self.decoder.bucket(sr)

    def decode(self, latents: torch.Tensor, sr_cond: int | torch.Tensor | None = None,
               state: ConvStreamState | None = None) -> torch.Tensor:
        """Latents -> waveform at :attr:`out_sample_rate`.

        Args:
            latents: ``[B, latent_dim, T]``.
            sr_cond: sample-rate condition (see :meth:`sr_bucket`); default :attr:`out_sample_rate`.
            state: continue a stream (see :class:`ConvStreamState`); ``None`` decodes from silence, as the
                reference's one-shot ``decode``. Prefer ``StreamingAudioVAEDecoder(vae)``, which also checks the batch.

        Returns:
            ``[B, 1, decode_hop_length * T]``, values in (-1, 1).
        """
        z = self.check_latents(latents)
        return self.decoder(z, self.sr_bucket(sr_cond, z.shape[0]), state)

