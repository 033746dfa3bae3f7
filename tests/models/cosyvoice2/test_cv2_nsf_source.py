"""The HiFT sine source with more harmonics than the reference's 9: overtones near Nyquist fade out instead of
folding back as inharmonic tones; a reference-sized source is not touched (its parity: test_cv2_hift.py)."""

from __future__ import annotations

import torch

from cadenza.models.cosyvoice2.config import HiFTConfig
from cadenza.models.cosyvoice2.nsf_source import SineGen2, draw_source_noise

SR = 24000


def _sines(f0: float, harmonics: int, seconds: float = 0.5) -> torch.Tensor:
    """The noiseless sum of the source's sines for a steady ``f0``: ``[samples]``."""
    gen = SineGen2(HiFTConfig(nb_harmonics=harmonics - 1, nsf_sigma=0.0))
    length = int(SR * seconds)
    noise = draw_source_noise(1, length, harmonics, torch.Generator().manual_seed(0))
    sines, uv = gen(torch.full((1, length, 1), f0), noise)
    assert bool(uv.all())
    return sines[0].sum(dim=-1)


def _spectrum(x: torch.Tensor) -> torch.Tensor:
    """Power per 1 Hz bin of the middle 0.25 s (a window over whole periods of the test tones)."""
    mid = x[SR // 8: SR // 8 + SR // 4]
    return torch.fft.rfft(mid * torch.hann_window(mid.numel(), periodic=True)).abs() ** 2


def test_many_harmonics_reach_the_band_of_a_low_voice():
    power = _spectrum(_sines(90.0, 45))
    freqs = torch.fft.rfftfreq(SR // 4, 1 / SR)
    for k in (1, 10, 30, 45):  # 90 Hz ... 4,050 Hz, all of equal amplitude (the raw sines, before the mix)
        peak = power[(freqs - 90.0 * k).abs() < 8].max()
        assert peak > 0.1 * power.max(), k
    assert power[freqs > 4200].sum() < 1e-6 * power.sum()  # nothing past the 45th


def test_overtones_fade_out_below_nyquist_instead_of_folding_back():
    f0 = 470.0  # 24 kHz is no multiple of it: a folded overtone would land between the harmonics
    power = _spectrum(_sines(f0, 45))
    freqs = torch.fft.rfftfreq(SR // 4, 1 / SR)
    assert power[freqs > 0.45 * SR].sum() < 1e-6 * power.sum()
    near_harmonic = torch.zeros_like(freqs, dtype=torch.bool)
    for k in range(1, int(0.45 * SR / f0) + 1):
        near_harmonic |= (freqs - k * f0).abs() < 20  # the Hann window's main lobe and first sidelobes
    stray = power[~near_harmonic].sum() / power.sum()
    assert stray < 1e-4, stray  # measured 5e-6; without the fade the 23rd-45th overtones fold: 0.51
    # The fade itself: the 21st overtone (9,870 Hz) is under the 0.4 x SR knee, the 23rd (10,810 Hz) is past 0.45.
    assert power[(freqs - 21 * f0).abs() < 8].max() > 0.1 * power[(freqs - f0).abs() < 8].max()


def test_a_reference_sized_source_is_not_masked():
    reference = SineGen2(HiFTConfig())  # 9 sines: 0.4 x 24 kHz only past f0 = 1 kHz
    assert not reference.fade_overtones
    power = _spectrum(_sines(1200.0, 9))  # a 9-sine source driven past any voice keeps its 9th at 10.8 kHz, as the reference
    freqs = torch.fft.rfftfreq(SR // 4, 1 / SR)
    assert power[(freqs - 10800).abs() < 8].max() > 0.1 * power[(freqs - 1200).abs() < 8].max()
    wide = SineGen2(HiFTConfig(nb_harmonics=44))
    gain = wide.below_nyquist(torch.tensor([0.3, 0.4, 0.425, 0.45, 0.6]) * SR)
    assert torch.allclose(gain, torch.tensor([1.0, 1.0, 0.5, 0.0, 0.0]), atol=1e-6)
