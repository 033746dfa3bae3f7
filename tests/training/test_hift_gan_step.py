"""The vocoder stage's GAN step (``training/hift_stage.py``): one generator forward for both turns, a generator turn
whose gradient is the plain formulation's, and the discriminators under bfloat16 autocast when asked."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.training.hift.data import crop_batch
from cadenza.training.hift_stage import HiFTStage
from helpers import one_torch_thread
from hift_training_data import CONFIG


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def test_generator_turn_takes_the_gradient_of_scoring_both_with_a_trainable_discriminator(hift_corpus):
    """The GAN step runs the generator once and, in the generator's turn, scores real audio without a graph and the
    generated audio with the discriminator's weights held out of the backward. The generator's gradient must be the
    one of the plain formulation (a second generator forward, real and generated scored together by a trainable
    discriminator), and the discriminator must be trainable again afterwards."""
    torch.manual_seed(0)
    # A vanishing learning rate and no clipping: the step leaves the weights as they were (to float precision) and
    # its gradients as the backward left them.
    config = {**CONFIG, "train": {"optim": {"lr": 1e-30, "grad_clip": 0.0}},
              "hift": {**CONFIG["hift"], "loss": {"stft_weight": 1.0, "periodic_weight": 1.0}}}
    stage = HiFTStage(config, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    batch = [stage.dataset()[i] for i in range(3)]
    stage.train_step(batch, 1)
    got = {n: p.grad.clone() for n, p in stage.generator.named_parameters() if p.grad is not None}
    assert got and all(p.requires_grad for p in stage.discriminator.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in stage.discriminator.parameters())

    # The plain formulation, on the same crops (drawn from the seed and the step) and the same weights.
    cfg = stage.model_cfg
    crops = crop_batch(batch, stage.cfg.segment_samples, cfg.hop_length, cfg.nb_harmonics + 1, stage.train_cfg.seed,
                       1, stage.cfg.speed_perturb, stage.cfg.speed_perturb_share)
    mel = flow_prompt_mel(crops.speech, stage.mel_cfg)
    stage.generator.zero_grad(set_to_none=True)
    fake, f0_pred = stage.g_forward(mel, crops.rand_ini, crops.sine_noise, None)
    real_scores, fake_scores, real_maps, fake_maps = stage.discriminator(crops.speech, fake)
    loss, _ = stage._generator_loss(crops.speech, fake, f0_pred, crops.f0, real_scores, fake_scores, real_maps,
                                    fake_maps)
    loss.backward()
    want = {n: p.grad for n, p in stage.generator.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    for n in want:  # float32 sums in another order: each tensor's gradient within 1e-4 of its norm (a wrong turn: ~1)
        assert (got[n] - want[n]).norm() <= 1e-4 * want[n].norm() + 1e-8, n


def test_discriminator_bf16_runs_the_discriminators_in_bfloat16_and_the_losses_in_float32(hift_corpus):
    """``hift.discriminator_bf16``: the discriminators' convolutions run under bfloat16 autocast, their outputs come
    back float32 (so every loss is float32), the weights stay float32, and a step trains as the float32 one does
    (the same losses to bfloat16's precision)."""
    def first_step(bf16: bool) -> tuple[HiFTStage, dict[str, float]]:
        torch.manual_seed(0)
        stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "discriminator_bf16": bf16}}, hift_corpus)
        stage.setup(torch.device("cpu"), lambda m: m)
        return stage, stage.train_step([stage.dataset()[i] for i in range(3)], 0)

    stage, bf16 = first_step(True)
    _, fp32 = first_step(False)
    assert all(p.dtype == torch.float32 for p in stage.discriminator.parameters())
    for k in ("loss_d", "loss_adv", "loss_fm", "loss_mel"):
        assert math.isfinite(bf16[k]) and bf16[k] == pytest.approx(fp32[k], rel=0.05), k
    assert bf16["loss_d"] != fp32["loss_d"]  # the discriminators did run in bfloat16
    with stage._discriminator_precision():
        scores, _ = stage.discriminator.score(torch.randn(2, 2880))
    assert scores[0].dtype == torch.bfloat16  # autocast reaches the convolutions; _float32 brings them back


@pytest.mark.parametrize("fast_bf16", [False, True])
def test_discriminator_bf16_warns_where_the_cpu_only_emulates_bfloat16(hift_corpus, monkeypatch, caplog, fast_bf16):
    """On a CPU without bfloat16 arithmetic (AVX2 only) the option makes training several times slower: setup says so,
    naming the CPU; where the CPU has it, nothing is said."""
    import cadenza.training.hift_stage as hift_stage
    from cadenza.engine.precision import CpuCapability

    cpu = CpuCapability("Test CPU", amx_bf16=False, avx512_bf16=fast_bf16, avx2=True)
    monkeypatch.setattr(hift_stage, "detect_cpu", lambda: cpu)
    stage = HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "discriminator_bf16": True}}, hift_corpus)
    with caplog.at_level(logging.WARNING, logger="cadenza"):
        stage.setup(torch.device("cpu"), lambda m: m)
    warned = [r for r in caplog.records if "discriminator_bf16" in r.getMessage()]
    assert bool(warned) != fast_bf16
    if warned:
        assert "Test CPU (AVX2)" in warned[0].getMessage() and "set it to false" in warned[0].getMessage()
