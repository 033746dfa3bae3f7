"""The output phases of HiFT's transposed convolutions (training/hift/upsampler_phases.py): which taps make which
phase, the balancing projection (a constant input comes out constant, not modulated at the input frame rate), and
the two training options built on them — ``hift.even_upsample_gain`` (exported balanced, loadable, resumable) and
``hift.loss.upsample_gain_weight`` (the penalty lowers the imbalance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cadenza.audio.mel import flow_prompt_mel
from cadenza.errors import InputError
from cadenza.layers.weight_norm import fold_weight_norm
from cadenza.models.cosyvoice2.hift import HiFTGenerator
from cadenza.models.cosyvoice2.nsf_source import draw_source_noise
from cadenza.training.hift.data import crop_batch
from cadenza.training.hift.upsampler_phases import (
    EqualPhaseGain,
    phase_gain_imbalance,
    phase_gains,
    phase_taps,
)
from cadenza.training.hift_stage import EXPORT_NAME, HiFTStage
from helpers import one_torch_thread
from hift_training_data import CONFIG

RELEASE_UPSAMPLERS = ((16, 8, 4), (11, 5, 3), (7, 3, 2))  # (kernel, stride, padding) of CosyVoice 2's HiFT


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.mark.parametrize("kernel,stride,padding", RELEASE_UPSAMPLERS)
def test_phase_taps_are_the_taps_that_write_each_output_phase(kernel, stride, padding):
    """Probed with torch itself: a kernel with one non-zero tap writes only the outputs of that tap's phase."""
    taps = phase_taps(kernel, stride, padding)
    assert sorted(j for idx in taps for j in idx) == list(range(kernel))
    x = torch.ones(1, 1, 12)
    for j in range(kernel):
        w = torch.zeros(1, 1, kernel)
        w[0, 0, j] = 1.0
        out = F.conv_transpose1d(x, w, stride=stride, padding=padding)[0, 0]
        written = {int(i) % stride for i in torch.nonzero(out).flatten()}
        assert written == {next(p for p, idx in enumerate(taps) if j in idx)}


@pytest.mark.parametrize("kernel,stride,padding", RELEASE_UPSAMPLERS)
def test_balanced_weights_upsample_a_constant_input_to_a_constant_output(kernel, stride, padding):
    torch.manual_seed(0)
    weight = torch.randn(6, 4, kernel)
    project = EqualPhaseGain(kernel, stride, padding)
    x = torch.randn(1, 6, 1).expand(1, 6, 30)  # a steady input: every frame the same
    inner = slice(3 * stride, -3 * stride)  # away from the edges

    raw = F.conv_transpose1d(x, weight, stride=stride, padding=padding)[..., inner]
    balanced = F.conv_transpose1d(x, project(weight), stride=stride, padding=padding)[..., inner]
    # Raw: modulated with a period of one input frame (the checkerboard); balanced: flat.
    assert raw.std(-1).min() > 0.05 * raw.abs().mean()
    assert balanced.std(-1).max() < 1e-5 * balanced.abs().mean()
    raw_period = raw[..., :stride]
    assert torch.allclose(raw[..., stride:2 * stride], raw_period, atol=1e-5)

    # A projection: idempotent, orthogonal (symmetric), and only the phase gains change.
    gains = phase_gains(project(weight), stride, padding)
    assert torch.allclose(gains, gains[..., :1].expand_as(gains), atol=1e-5)
    assert torch.allclose(project(project(weight)), project(weight), atol=1e-6)
    a, b = torch.randn(6, 4, kernel), torch.randn(6, 4, kernel)
    assert float((project(a) * b).sum()) == pytest.approx(float((a * project(b)).sum()), rel=1e-4, abs=1e-4)

    conv = nn.ConvTranspose1d(6, 4, kernel, stride, padding=padding, bias=False)
    with torch.no_grad():
        conv.weight.copy_(weight)
    assert 0.3 < _imbalance(conv) < 1.0
    with torch.no_grad():
        conv.weight.copy_(project(weight))
    assert _imbalance(conv) < 1e-10


def _imbalance(conv: nn.ConvTranspose1d) -> float:
    return float(phase_gain_imbalance(conv).detach())


def _mel_and_noise(stage, batch):
    cfg = stage.model_cfg
    mel = flow_prompt_mel(crop_batch(batch[:1], 2880, 480, 9, 0, 0).speech, stage.mel_cfg)
    noise = draw_source_noise(1, mel.shape[-1] * cfg.hop_length, cfg.nb_harmonics + 1,
                              torch.Generator().manual_seed(7))
    return mel, noise


def test_even_upsample_gain_trains_balanced_and_exports_a_balanced_release_file(hift_corpus, tmp_path):
    torch.manual_seed(0)
    plain = HiFTStage(CONFIG, hift_corpus)
    plain.setup(torch.device("cpu"), lambda m: m)
    batch = [plain.dataset()[i] for i in range(3)]
    plain.train_step(batch, 0)
    assert _imbalance(plain.generator.ups[0]) > 0.3

    config = {**CONFIG, "hift": {**CONFIG["hift"], "even_upsample_gain": [0], "average_decay": 0.5}}
    stage = HiFTStage(config, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    stage.load_state_dict(plain.state_dict())  # a checkpoint of a run without it continues with it
    assert _imbalance(stage.generator.ups[0]) < 1e-10
    assert _imbalance(stage.generator.ups[1]) > 0.3  # only the named upsampler
    for step in range(1, 4):
        metrics = stage.train_step(batch, step)
        assert metrics["loss_upsample_gain"] == 0.0  # the penalty is off
        assert _imbalance(stage.generator.ups[0]) < 1e-10

    stage.export(tmp_path)
    state = torch.load(tmp_path / EXPORT_NAME, map_location="cpu", weights_only=True)
    assert "ups.0.parametrizations.weight.original1" in state  # the release layout, weight norm unfolded
    loaded = HiFTGenerator(stage.model_cfg).eval()
    loaded.load_reference_state_dict(state)
    assert _imbalance(loaded.ups[0]) < 1e-10
    mel, noise = _mel_and_noise(stage, batch)
    averaged = stage.average.averaged_module(stage.generator).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(mel, noise=noise)[0], averaged(mel, noise=noise)[0], atol=1e-5)

    resumed = HiFTStage(config, hift_corpus)  # its own checkpoints resume (the state-dict names are the release's)
    resumed.setup(torch.device("cpu"), lambda m: m)
    resumed.load_state_dict(stage.state_dict())
    resumed.generator.eval()
    stage.generator.eval()
    with torch.no_grad():
        assert torch.equal(resumed.generator(mel, noise=noise)[0], stage.generator(mel, noise=noise)[0])
    assert fold_weight_norm(state).keys() == HiFTGenerator(stage.model_cfg).state_dict().keys()


def test_upsample_gain_penalty_lowers_the_imbalance(hift_corpus):
    torch.manual_seed(0)
    config = {**CONFIG, "hift": {**CONFIG["hift"], "loss": {"upsample_gain_weight": 1000.0}}}
    stage = HiFTStage(config, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    batch = [stage.dataset()[i] for i in range(3)]
    before = _imbalance(stage.generator.ups[0])
    first = stage.train_step(batch, 0)["loss_upsample_gain"]
    assert first == pytest.approx(before, rel=1e-5)
    for step in range(1, 8):
        stage.train_step(batch, step)
    assert _imbalance(stage.generator.ups[0]) < 0.7 * before
    # Untouched upsamplers keep theirs (no other loss pulls it down that fast).
    assert _imbalance(stage.generator.ups[1]) > 0.3


@pytest.mark.parametrize("hift", [{"even_upsample_gain": [3]}, {"even_upsample_gain": [-1]},
                                  {"loss": {"upsample_gain_layers": [5]}}, {"loss": {"upsample_gain_weight": -1}}])
def test_upsampler_options_are_validated(hift_corpus, hift):
    with pytest.raises(InputError, match="upsample"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], **hift}}, hift_corpus)
