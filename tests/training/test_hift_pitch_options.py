"""HiFT training options that push a vocoder to take its pitch from the source: speed-perturbed crops
(``hift.speed_perturb``: the audio resampled, its f0 track following, crops without it unchanged) and the source
path's starting gain (``hift.source_path_gain``); their settings are validated."""

from __future__ import annotations

import math

import pytest
import torch

from cadenza.audio.pitch import yin_f0
from cadenza.errors import InputError
from cadenza.training.hift.data import crop_batch
from cadenza.training.hift_stage import HiFTStage
from helpers import one_torch_thread

SR, HOP = 24000, 480


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _glide_item(index: int, seconds: float = 2.0, low: float = 90.0, high: float = 180.0) -> dict:
    """A harmonic tone gliding ``low`` -> ``high`` Hz and its exact per-frame f0 track."""
    n = int(SR * seconds)
    f0 = torch.linspace(low, high, n)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / SR
    wav = 0.3 * sum(torch.sin(k * phase) / k for k in range(1, 6))
    track = f0[HOP // 2::HOP][: n // HOP].clone()
    return {"index": index, "wav": wav, "f0": track}


def test_perturbed_crops_change_pitch_and_their_f0_track_follows():
    items = [_glide_item(i) for i in range(8)]
    crops = crop_batch(items, 9600, HOP, 9, seed=3, step=7, speed_perturb=(0.7, 1.5), speed_perturb_share=1.0)
    plain = crop_batch(items, 9600, HOP, 9, seed=3, step=7)
    assert crops.speech.shape == plain.speech.shape == (8, 9600) and crops.f0.shape == (8, 20)
    ratios = []
    for speech, track in zip(crops.speech, crops.f0):
        heard = yin_f0(speech, SR, HOP, 20)
        both = (heard > 0) & (track > 0)
        assert both.sum() >= 15
        # The stored track says what the resampled audio sounds like (nearest old frame: within a few per cent).
        assert ((heard[both] - track[both]).abs() / heard[both]).median() < 0.03
    assert not torch.equal(crops.speech, plain.speech)
    # The rates drawn: steady 120 Hz tones come out at 120 x rate, every crop at its own rate within the range.
    steady = crop_batch([_glide_item(i, low=120.0, high=120.0) for i in range(8)], 9600, HOP, 9, seed=3, step=7,
                        speed_perturb=(0.7, 1.5), speed_perturb_share=1.0)
    for speech, track in zip(steady.speech, steady.f0):
        heard = yin_f0(speech, SR, HOP, 20)
        ratios.append(float(heard[heard > 0].median()) / 120.0)
        assert track.unique().numel() == 1 and float(track[0]) / 120.0 == pytest.approx(ratios[-1], rel=2e-3)
    assert all(0.7 <= r <= 1.5 for r in ratios) and len({round(r, 2) for r in ratios}) == 8
    assert max(ratios) - min(ratios) > 0.3
    # Deterministic per (seed, step, item).
    again = crop_batch(items, 9600, HOP, 9, seed=3, step=7, speed_perturb=(0.7, 1.5), speed_perturb_share=1.0)
    assert torch.equal(again.speech, crops.speech) and torch.equal(again.f0, crops.f0)


def test_share_zero_gives_the_plain_crop_positions_of_a_perturbing_run():
    items = [_glide_item(i) for i in range(4)]
    off = crop_batch(items, 9600, HOP, 9, seed=1, step=2, speed_perturb=(0.7, 1.5), speed_perturb_share=0.0)
    for speech, track, item in zip(off.speech, off.f0, items):
        # An unresampled crop: a frame-aligned slice of the item with its own track.
        start = next(k for k in range(0, item["wav"].shape[0] - 9600 + 1, HOP)
                     if torch.equal(item["wav"][k:k + 9600], speech))
        assert torch.equal(item["f0"][start // HOP: start // HOP + 20], track)


def test_a_short_item_is_padded_with_unvoiced_frames():
    item = _glide_item(0, seconds=0.3)  # 7,200 samples: shorter than the crop even before speeding up
    crops = crop_batch([item], 9600, HOP, 9, seed=0, step=0, speed_perturb=(1.4, 1.4), speed_perturb_share=1.0)
    voiced = int((crops.f0[0] > 0).sum())
    assert voiced == math.ceil(7200 / 1.4 / HOP) and (crops.speech[0, int(7200 / 1.4) + HOP:] == 0).all()
    assert float(crops.f0[0, 0]) == pytest.approx(1.4 * float(item["f0"][0]), rel=1e-3)


def test_stage_settings_are_validated(tmp_path):
    base = {"model": {"config": "official",
                      "overrides": {"hift": {"base_channels": 16, "f0_predictor": {"cond_channels": 16}}}}}
    for bad, match in (({"speed_perturb": [1.5, 0.7]}, "speed_perturb"), ({"speed_perturb": [0, 1.2]}, "speed_perturb"),
                       ({"speed_perturb_share": 1.5}, "speed_perturb_share"),
                       ({"speed_perturb": [0.8, 1.2], "input_mel": "flow"}, "input_mel: audio")):
        with pytest.raises(InputError, match=match):
            HiFTStage({**base, "hift": bad}, tmp_path)
    stage = HiFTStage({**base, "hift": {"speed_perturb": [0.8, 1.25], "speed_perturb_share": 0.25}}, tmp_path)
    assert stage.cfg.speed_perturb == (0.8, 1.25) and stage.cfg.speed_perturb_share == 0.25


def test_a_stored_input_mel_refuses_perturbation():
    item = {**_glide_item(0), "mel": torch.zeros(80, 100)}
    with pytest.raises(ValueError, match="stored input mel"):
        crop_batch([item], 9600, HOP, 9, seed=0, step=0, speed_perturb=(0.8, 1.2), speed_perturb_share=1.0)


def test_source_path_gain_scales_the_source_input_convs_before_training(tmp_path):
    """``hift.source_path_gain``: the generator starts with its ``source_downs`` convs (weights and biases) scaled,
    the rest of the initial weights unchanged, and the export/resume path sees the scaled weights as trained ones."""
    base = {"model": {"config": "official",
                      "overrides": {"hift": {"base_channels": 16, "f0_predictor": {"cond_channels": 16}}}},
            "hift": {"weight_norm": False}}
    torch.manual_seed(0)
    init = HiFTStage(base, tmp_path).build_generator()
    torch.save(init.state_dict(), tmp_path / "hift.pt")
    plain = HiFTStage({**base, "hift": {**base["hift"], "init_hift": str(tmp_path / "hift.pt")}}, tmp_path)
    scaled = HiFTStage({**base, "hift": {**base["hift"], "init_hift": str(tmp_path / "hift.pt"),
                                         "source_path_gain": 2.0}}, tmp_path)
    a, b = plain.build_generator().state_dict(), scaled.build_generator().state_dict()
    assert a.keys() == b.keys()
    for key in a:
        expected = 2.0 * a[key] if key.startswith("source_downs.") else a[key]
        assert torch.equal(b[key], expected), key
    assert any(key.startswith("source_downs.") and a[key].abs().sum() > 0 for key in a)
    with pytest.raises(InputError, match="source_path_gain"):
        HiFTStage({**base, "hift": {"source_path_gain": 0.0}}, tmp_path)
