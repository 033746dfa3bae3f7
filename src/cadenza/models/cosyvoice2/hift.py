"""HiFT vocoder (reference ``HiFTGenerator``): neural source filter + iSTFT HiFi-GAN, mel -> 24 kHz waveform.

Pipeline: mel -> f0 (``f0_predictor``) -> harmonic source (``m_source``) -> STFT of the source, injected at every
upsampling stage of a HiFi-GAN generator whose output is a magnitude/phase spectrogram -> iSTFT.

Parameter names equal the released ``hift.pt`` after :func:`cadenza.layers.weight_norm.fold_weight_norm`; use
:meth:`HiFTGenerator.load_reference_state_dict` to load a released file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import CheckpointError, InputError
from cadenza.layers.weight_norm import fold_weight_norm
from cadenza.models.cosyvoice2.config import HiFTConfig
from cadenza.models.cosyvoice2.f0_predictor import ConvRNNF0Predictor
from cadenza.models.cosyvoice2.hift_blocks import ResBlock, istft_mag_phase, periodic_hann, stft_real_imag
from cadenza.models.cosyvoice2.nsf_source import SourceModuleHnNSF, SourceNoise, draw_source_noise

PRE_POST_KERNEL = 7  # conv_pre / conv_post kernel (fixed in the reference, not a config entry)
MAX_MAGNITUDE = 100.0  # the reference clips exp(log-magnitude) here before the iSTFT


def _fresh_generator() -> torch.Generator:
    """A generator with a random seed (torch's global RNG stays untouched)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


class HiFTGenerator(nn.Module):
    """Mel -> waveform vocoder.

    Args:
        cfg: vocoder hyper-parameters; every size is read from it.

    Shapes: ``mel [B, n_mels, F]`` -> ``speech [B, hop_length * F]``, ``source [B, 1, hop_length * F]``.
    """

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        if cfg.sampling_rate == 22050:
            # The reference switches to the per-sample ``SineGen`` at 22.05 kHz (CosyVoice 1 vocoder).
            raise CheckpointError("22.05 kHz HiFT (CosyVoice 1, SineGen source) is not supported")
        self.cfg = cfg
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        self.num_upsamples = len(cfg.upsample_rates)
        self.n_fft = cfg.istft_n_fft
        self.hop = cfg.istft_hop_len
        spec_channels = 2 * (self.n_fft // 2 + 1)  # real ++ imaginary bins

        self.m_source = SourceModuleHnNSF(cfg)
        self.conv_pre = nn.Conv1d(cfg.in_channels, cfg.base_channels, PRE_POST_KERNEL,
                                  padding=PRE_POST_KERNEL // 2)
        stage_channels = [cfg.base_channels // 2 ** (i + 1) for i in range(self.num_upsamples)]

        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(cfg.base_channels // 2**i, stage_channels[i], k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))
        )

        # The source STFT (frame rate = sample rate / hop) is brought to each stage's rate by a strided conv;
        # stage i runs at the product of the first i+1 upsample rates.
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (k, d) in enumerate(zip(cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            down = 1
            for r in cfg.upsample_rates[i + 1:]:
                down *= r
            if down == 1:
                self.source_downs.append(nn.Conv1d(spec_channels, stage_channels[i], 1))
            else:
                self.source_downs.append(nn.Conv1d(spec_channels, stage_channels[i], 2 * down, down, padding=down // 2))
            self.source_resblocks.append(ResBlock(stage_channels[i], k, tuple(d)))

        self.resblocks = nn.ModuleList(
            ResBlock(ch, k, tuple(d))
            for ch in stage_channels
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
        )
        self.conv_post = nn.Conv1d(stage_channels[-1], spec_channels, PRE_POST_KERNEL, padding=PRE_POST_KERNEL // 2)
        self.register_buffer("stft_window", periodic_hann(self.n_fft), persistent=False)
        self.f0_predictor = ConvRNNF0Predictor(cfg)

    # ---------------------------------------------------------------- loading

    def weight_norm_module_names(self) -> list[str]:
        """Submodules that the reference wraps in ``weight_norm``: every conv except the source downsamplers."""
        return [
            name for name, m in self.named_modules()
            if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) and not name.startswith("source_downs.")
        ]

    def load_reference_state_dict(self, state_dict: Mapping[str, object]) -> None:
        """Load a released ``hift.pt`` state dict (either weight-norm naming, or already folded), strictly.

        As in the reference loader, the substring ``generator.`` is removed from every key (so a full HiFi-GAN
        training checkpoint loads); non-tensor entries (``epoch``, ``step``) are ignored.

        Raises:
            CheckpointError: missing, unexpected or mis-shaped tensors.
        """
        tensors = {k.replace("generator.", ""): v for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
        folded = fold_weight_norm(tensors)
        expected = self.state_dict()
        missing = sorted(set(expected) - set(folded))
        unexpected = sorted(set(folded) - set(expected))
        if missing or unexpected:
            raise CheckpointError(f"HiFT checkpoint does not match the config: missing {missing[:5]}"
                                  f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                                  f"{' ...' if len(unexpected) > 5 else ''}")
        bad = [f"{k} {tuple(folded[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
               if folded[k].shape != v.shape]
        if bad:
            raise CheckpointError(f"HiFT checkpoint shapes do not match the config: {bad[:5]}")
        self.load_state_dict(folded, strict=True)

    # ---------------------------------------------------------------- precision

    # The convolution stack that turns mel + source spectrum into the output spectrum: nearly all of HiFT's work.
    # The f0 predictor, the harmonic source and both STFTs stay float32 (an f0 or phase error would shift the
    # pitch and phase of the whole waveform; they cost little).
    CONV_STACK = ("conv_pre", "ups", "source_downs", "source_resblocks", "resblocks", "conv_post")

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the convolution stack (float32 unless ``set_compute_dtype`` changed it)."""
        return self.conv_pre.weight.dtype

    def set_compute_dtype(self, dtype: torch.dtype) -> None:
        """Run the convolution stack in ``dtype`` (its weights cast in place; one way)."""
        for name in self.CONV_STACK:
            getattr(self, name).to(dtype)

    # ---------------------------------------------------------------- forward

    def source_from_f0(self, f0: torch.Tensor, generator: torch.Generator | None = None,
                       noise: SourceNoise | None = None) -> torch.Tensor:
        """``f0 [B, F]`` (Hz per mel frame) -> ``source [B, 1, hop_length * F]``.

        Randomness: ``noise`` if given, else drawn from ``generator``, else from a fresh, randomly seeded generator
        (torch's global RNG is never used implicitly; pass ``torch.default_generator`` to use it as the reference does).
        """
        # Nearest upsampling by scale factor, as the reference's nn.Upsample (kept for bit parity).
        f0_up = F.interpolate(f0[:, None], scale_factor=float(self.cfg.hop_length), mode="nearest").transpose(1, 2)
        if noise is None:
            noise = draw_source_noise(f0_up.shape[0], f0_up.shape[1], self.cfg.nb_harmonics + 1,
                                      generator if generator is not None else _fresh_generator())
        return self.m_source(f0_up, noise).transpose(1, 2)

    def draw_noise(self, frames: int, generators: Sequence[torch.Generator | None]) -> SourceNoise:
        """The source randomness of a batch of ``frames``-frame mels, row ``i`` drawn from ``generators[i]`` exactly
        as a batch-1 call with that generator draws it (None: a fresh random generator), so a batched call gives
        each row the output it would get alone."""
        length, harmonics = self.cfg.hop_length * frames, self.cfg.nb_harmonics + 1
        rows = [draw_source_noise(1, length, harmonics, g if g is not None else _fresh_generator())
                for g in generators]
        return SourceNoise(rand_ini=torch.cat([r.rand_ini for r in rows]),
                           sine_noise=torch.cat([r.sine_noise for r in rows]))

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """``mel [B, n_mels, F]``, ``source [B, 1, L]`` -> ``speech [B, L]`` in ±audio_limit (L = hop_length * F)."""
        s_stft = stft_real_imag(source.squeeze(1), self.n_fft, self.hop, self.stft_window)
        dtype, out_dtype = self.compute_dtype, mel.dtype
        if dtype != out_dtype:  # a lower-precision conv stack (CPU fast path): cast in here, back out before exp
            s_stft, mel = s_stft.to(dtype), mel.to(dtype)

        x = self.conv_pre(mel)
        for i in range(self.num_upsamples):
            x = F.leaky_relu(x, self.cfg.lrelu_slope)
            x = self.ups[i](x)
            if i == self.num_upsamples - 1:
                # One extra frame on the left so the length equals the source STFT's (L / hop + 1 frames).
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * self.num_kernels](x)
            for j in range(1, self.num_kernels):
                xs = xs + self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels

        x = F.leaky_relu(x)  # the reference uses the default slope 0.01 here, not lrelu_slope
        x = self.conv_post(x).to(out_dtype)
        bins = self.n_fft // 2 + 1
        magnitude = torch.clamp(torch.exp(x[:, :bins]), max=MAX_MAGNITUDE)
        # sin() bounds the predicted phase to [-1, 1] rad; that is what the model was trained with, so keep it.
        phase = torch.sin(x[:, bins:])
        speech = istft_mag_phase(magnitude, phase, self.n_fft, self.hop, self.stft_window)
        return torch.clamp(speech, -self.cfg.audio_limit, self.cfg.audio_limit)

    def forward(self, mel: torch.Tensor, cache_source: torch.Tensor | None = None,
                generator: torch.Generator | None = None,
                noise: SourceNoise | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``mel [B, n_mels, F]`` -> ``(speech [B, L], source [B, 1, L])``, L = hop_length * F.

        Args:
            cache_source: ``[B, 1, S]``, S <= L: the previous chunk's last S source samples; they replace the first
                S samples of this call's source so that overlapping streaming chunks share the excitation.
            generator, noise: randomness of the source, see :meth:`source_from_f0`.
        """
        if mel.dim() != 3 or mel.shape[1] != self.cfg.in_channels:
            raise InputError(f"mel must be [B, {self.cfg.in_channels}, frames], got {tuple(mel.shape)}")
        f0 = self.f0_predictor(mel)
        source = self.source_from_f0(f0, generator=generator, noise=noise)
        if cache_source is not None and cache_source.shape[-1] > 0:
            cached = cache_source.shape[-1]
            if cached > source.shape[-1] or cache_source.shape[:2] != source.shape[:2]:
                raise InputError(f"cache_source {tuple(cache_source.shape)} does not fit source {tuple(source.shape)}")
            source = torch.cat([cache_source.to(source), source[:, :, cached:]], dim=2)
        return self.decode(mel, source), source

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, cache_source: torch.Tensor | None = None,
                  generator: torch.Generator | None = None,
                  noise: SourceNoise | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` without autograd (the reference's ``inference``)."""
        return self.forward(mel, cache_source=cache_source, generator=generator, noise=noise)
