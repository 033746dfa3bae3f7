"""The vocoder GAN's discriminators (training/hift/discriminators.py): outputs, the TPR loss, memory layout."""

from __future__ import annotations

import torch

from cadenza.training.hift.config import DiscriminatorConfig
from cadenza.training.hift.discriminators import HiFTDiscriminator
from cadenza.training.hift.losses import tpr_loss


def test_discriminator_outputs_and_tpr_loss():
    cfg = DiscriminatorConfig(period_channels=(4, 8, 16, 16), spec_channels=4)
    disc = HiFTDiscriminator(cfg)
    real, fake = torch.randn(2, 2880), torch.randn(2, 2880)
    rs, fs, rm, fm = disc(real, fake)
    assert len(rs) == len(fs) == len(cfg.periods) + len(cfg.resolutions) == len(rm) == len(fm)
    for r, f in zip(rs, fs):
        assert r.shape == f.shape and r.shape[0] == 2
    # Scoring real and fake together equals scoring them separately (no batch coupling).
    alone, _ = disc.discriminators[0](real)
    assert torch.allclose(rs[0], alone, atol=1e-5)

    tau = 0.04
    same = [torch.randn(2, 30)]
    assert float(tpr_loss(same, same, tau)) == 0.0  # nothing below the median: 0, not the reference's NaN
    loss = tpr_loss([torch.randn(2, 30) * 5], [torch.randn(2, 30)], tau)
    assert 0 < float(loss) <= tau


def test_spectrogram_discriminators_score_the_same_in_either_memory_layout():
    """``spec_channels_last`` (the default) changes only where the activations lie in memory: the same weights give
    the same scores, feature maps and weight gradients as the channels-first layout, and the maps are channels-last."""
    torch.manual_seed(0)
    wav = torch.randn(3, 4800)
    results = []
    for channels_last in (False, True):
        torch.manual_seed(1)
        disc = HiFTDiscriminator(DiscriminatorConfig(period_channels=(4, 8), spec_channels=8, periods=(2,),
                                                     spec_channels_last=channels_last))
        scores, maps = disc.score(wav)
        (sum(s.sum() for s in scores) + sum(m.abs().mean() for fm in maps for m in fm)).backward()
        grads = [p.grad.clone() for p in disc.parameters()]
        results.append((scores, maps, grads))
        spec_maps = maps[1]
        assert all(m.is_contiguous(memory_format=torch.channels_last) == channels_last for m in spec_maps[:-1])
    (s0, m0, g0), (s1, m1, g1) = results
    for a, b in zip(s0, s1):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for fa, fb in zip(m0, m1):
        for a, b in zip(fa, fb):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(g0, g1):  # sums over whole spectrograms, added up in another order: compare by norm
        assert float((a - b).norm() / a.norm()) < 1e-5
