"""``flow.average_decay``: the flow stage keeps an exponential moving average of its weights and exports it (as
flow-matching models are commonly sampled), carries it in its checkpoints, and starts it from a checkpoint's weights
when a run without one is continued with one (the average itself: tests/training/test_parameter_average.py)."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import InputError
from cadenza.training.flow_stage import FlowStage
from helpers import one_torch_thread

from small_model import small_training_model


def _stage(tmp_path, decay: float) -> FlowStage:
    config = {"model": small_training_model(), "train": {"max_steps": 10, "seed": 3},
              "flow": {"average_decay": decay} if decay else {}}
    stage = FlowStage(config, tmp_path)
    stage.setup(torch.device("cpu"), lambda m: m)
    return stage


def _batch(stage: FlowStage) -> dict:
    g = torch.Generator().manual_seed(0)
    ratio, spk = stage.flow_cfg.token_mel_ratio, stage.flow_cfg.spk_embed_dim
    items = [{"index": i, "tokens": torch.randint(0, stage.flow_cfg.vocab_size, (n,), generator=g),
              "mel": torch.randn(ratio * n, 80, generator=g), "spk": torch.randn(spk, generator=g)}
             for i, n in enumerate((12, 9))]
    return stage.collate(items)


def test_exports_the_average_and_resumes_it(tmp_path):
    torch.manual_seed(0)
    with one_torch_thread():
        stage = _stage(tmp_path, 0.5)
        batch = _batch(stage)
        for step in range(4):
            stage.train_step(batch, step)
        assert stage.average.updates == 4
        stage.export(tmp_path / "out")
        exported = torch.load(tmp_path / "out" / "flow.pt", map_location="cpu", weights_only=True)
        averaged = stage.average.averaged_module(stage.flow).state_dict()
        last = stage.flow.state_dict()
        assert all(torch.equal(exported[k], averaged[k]) for k in exported)
        assert any(not torch.equal(exported[k], last[k]) for k in exported)  # not the last step's weights
        assert set(exported) == set(last)  # buffers too (the fixed noise), from the live module

        resumed = _stage(tmp_path, 0.5)
        resumed.load_state_dict(stage.state_dict())
        assert resumed.average.updates == 4
        assert all(torch.equal(resumed.average.average[k], v) for k, v in stage.average.average.items())

        plain = _stage(tmp_path, 0.0)  # a run without the average, continued with one
        plain.train_step(batch, 0)
        assert plain.average is None and "flow_average" not in plain.state_dict()
        plain.export(tmp_path / "plain")
        plain_export = torch.load(tmp_path / "plain" / "flow.pt", map_location="cpu", weights_only=True)
        assert all(torch.equal(plain_export[k], v) for k, v in plain.flow.state_dict().items())
        continued = _stage(tmp_path, 0.5)
        continued.load_state_dict(plain.state_dict())
        assert continued.average.updates == 0
        assert all(torch.equal(continued.average.average[k], p) for k, p in plain.flow.named_parameters())


@pytest.mark.parametrize("bad", [1.0, -0.1])
def test_refuses_a_decay_outside_0_1(tmp_path, bad):
    with pytest.raises(InputError, match="average_decay"):
        _stage(tmp_path, bad)
