"""Typed settings of HiFT GAN training: discriminators and loss weights.

See docs/training_components.md, "3. HiFT vocoder GAN".

The generator's own sizes are :class:`cadenza.models.cosyvoice2.config.HiFTConfig`; :func:`config_from_mapping`
builds any of these frozen dataclasses from a YAML section (lists become tuples, unknown keys are errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from cadenza.errors import InputError

T = TypeVar("T")


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def config_from_mapping(cls: type[T], data: Mapping[str, Any] | None, what: str) -> T:
    """``cls(**data)`` with nested lists turned into tuples; unknown keys raise ``InputError`` naming ``what``."""
    data = dict(data or {})
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"unknown keys in {what}: {unknown}; known keys are {sorted(known)}")
    try:
        return cls(**{k: _tuples(v) for k, v in data.items()})
    except (TypeError, ValueError) as exc:
        raise InputError(f"invalid {what}: {exc}") from exc


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise InputError(msg)


@dataclass(frozen=True)
class DiscriminatorConfig:
    """Multi-period (HiFi-GAN) + multi-resolution STFT-magnitude discriminators.

    Attributes:
        periods: one period discriminator per entry (the waveform is folded into ``[T / p, p]``).
        period_channels: conv widths of a period discriminator; all but the last conv are strided.
        period_kernel, period_stride: along the folded time axis.
        resolutions: ``(n_fft, hop, win)`` of each spectrogram discriminator.
        spec_channels: conv width of the spectrogram discriminators.
        lrelu_slope: leaky-ReLU slope after every conv.
        spec_channels_last: run the spectrogram discriminators' convs on channels-last activations (the same
            arithmetic in another memory layout: with their few channels over large spectrograms, oneDNN's
            channels-first kernels are the slow path on a CPU; benchmarks/hift_discriminator_layout.py).
    """

    periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    period_channels: tuple[int, ...] = (32, 128, 512, 1024, 1024)
    period_kernel: int = 5
    period_stride: int = 3
    resolutions: tuple[tuple[int, int, int], ...] = ((1024, 120, 600), (2048, 240, 1200), (512, 50, 240))
    spec_channels: int = 32
    lrelu_slope: float = 0.1
    spec_channels_last: bool = True

    def __post_init__(self) -> None:
        _check(len(self.periods) > 0 and all(p > 0 for p in self.periods), "periods must be positive")
        _check(len(self.period_channels) >= 2 and all(c > 0 for c in self.period_channels),
               "period_channels needs at least two positive widths")
        _check(self.period_kernel > 0 and self.period_kernel % 2 == 1, "period_kernel must be odd")
        _check(self.period_stride > 0 and self.spec_channels > 0, "period_stride and spec_channels must be positive")
        _check(all(len(r) == 3 and r[2] <= r[0] and r[1] > 0 for r in self.resolutions),
               "resolutions must be (n_fft, hop, win) with win <= n_fft")


@dataclass(frozen=True)
class HiFTLossConfig:
    """Loss weights (generator loss = ``adv + fm * L_fm + mel * L_mel + tpr * L_tpr + f0 * L_f0 + stft * L_stft
    + periodic * L_periodic + phone_feature * L_phone_feature + phone_posterior * L_phone_posterior``)
    and the mel
    of the reconstruction loss (n_fft 1920, hop 480, 80 bins, up to Nyquist: the reference's ``fmax: null``).

    ``L_fm`` already contains the factor 2 of the reference's ``feature_loss``, so with ``fm_weight`` 2 feature
    matching counts 4x, as in the reference.
    """

    adv_weight: float = 1.0
    fm_weight: float = 2.0
    mel_weight: float = 45.0
    tpr_weight: float = 1.0
    tpr_tau: float = 0.04
    f0_weight: float = 1.0
    mel_n_fft: int = 1920
    mel_hop: int = 480
    mel_win: int = 1920
    mel_bins: int = 80
    mel_fmin: float = 0.0
    mel_fmax: float | None = None
    # Multi-resolution linear STFT loss (spectral convergence + log-magnitude L1 at each (n_fft, hop, win)), not in
    # the reference: the fine resolutions resolve the harmonics of a low voice that the mel loss blurs. 0 = off.
    stft_weight: float = 0.0
    stft_resolutions: tuple[tuple[int, int, int], ...] = ((512, 128, 512), (1024, 256, 1024), (2048, 512, 2048))
    # Frame-periodicity loss, not in the reference: the part of the waveform that repeats every mel hop (a local
    # mean over +-``periodic_span`` hops) must match the real speech's. A small vocoder can voice speech with a
    # buzz locked to its 50 Hz input frames instead of the pitch (cadenza-tiny's did; docs/cadenza-tiny.md,
    # "Quality"); no other loss here sees it directly. 0 = off.
    periodic_weight: float = 0.0
    periodic_span: int = 6
    # Phone loss, not in the reference (training/hift/phone_loss.py): a frozen frame-classifier speech tokenizer
    # (``hift.phone_model``) reads the real and the generated crop; ``phone_feature_weight`` weighs the L1 of its
    # hidden states, ``phone_posterior_weight`` the KL of its phone posteriors. 0 = off.
    phone_feature_weight: float = 0.0
    phone_posterior_weight: float = 0.0
    # Upsampler phase-gain penalty, not in the reference (training/hift/upsampler_phases.py): the imbalance of the
    # output phases' gains of the upsamplers ``upsample_gain_layers`` (indices into ``ups``), which buzzes at their
    # input frame rate; the soft form of ``hift.even_upsample_gain``. 0 = off.
    upsample_gain_weight: float = 0.0
    upsample_gain_layers: tuple[int, ...] = (0,)
    # Instantaneous-frequency loss, not in the reference (``losses.instantaneous_frequency_loss``): the generated
    # phase must advance from frame to frame as the real phase does, below ``phase_max_hz``, at each
    # ``phase_resolutions`` ``(n_fft, hop)``. 0 = off.
    phase_weight: float = 0.0
    phase_resolutions: tuple[tuple[int, int], ...] = ((1024, 128),)
    phase_max_hz: float = 4000.0

    def __post_init__(self) -> None:
        for name in ("adv_weight", "fm_weight", "mel_weight", "tpr_weight", "tpr_tau", "f0_weight", "stft_weight",
                     "periodic_weight", "phone_feature_weight", "phone_posterior_weight", "upsample_gain_weight",
                     "phase_weight"):
            _check(getattr(self, name) >= 0, f"{name} must be >= 0")
        _check(isinstance(self.periodic_span, int) and self.periodic_span >= 1, "periodic_span must be an int >= 1")
        _check(self.mel_win <= self.mel_n_fft and self.mel_hop > 0 and self.mel_bins > 0, "invalid loss mel sizes")
        _check(all(len(r) == 3 and 0 < r[1] and 0 < r[2] <= r[0] for r in self.stft_resolutions),
               "stft_resolutions must be [n_fft, hop, win] with 0 < win <= n_fft and hop > 0")
        _check(len(self.phase_resolutions) > 0 and all(len(r) == 2 and 0 < r[1] <= r[0] for r in self.phase_resolutions),
               "phase_resolutions must be [n_fft, hop] pairs with 0 < hop <= n_fft")
        _check(self.phase_max_hz > 0, "phase_max_hz must be > 0")

    @property
    def uses_phone_loss(self) -> bool:
        return self.phone_feature_weight > 0 or self.phone_posterior_weight > 0
