"""The exponential moving average of a module's parameters that a training stage can export
(``cadenza.training.parameter_average``; the HiFT stage's use of it: tests/training/test_train_hift.py)."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CheckpointError, InputError
from cadenza.training.parameter_average import ParameterAverage


def test_parameter_average_follows_the_weights_with_its_decay():
    layer = torch.nn.Linear(3, 2)
    average = ParameterAverage(layer, 0.9)
    start = {k: v.detach().clone() for k, v in layer.named_parameters()}
    expected = {k: v.clone() for k, v in start.items()}
    for t in range(30):
        with torch.no_grad():
            for p in layer.parameters():
                p.add_(1.0)
        average.update(layer)
        decay = min(0.9, (1 + t) / (10 + t))
        expected = {k: decay * expected[k] + (1 - decay) * dict(layer.named_parameters())[k].detach()
                    for k in expected}
    averaged = average.averaged_module(layer)
    for name, p in averaged.named_parameters():
        assert torch.allclose(p, expected[name], atol=1e-5)
        # 30 steps of +1: the average lags the weights by about decay / (1 - decay) steps, the decay still warming
        # up ((1 + t) / (10 + t) = 0.77 at the last step: ~3 steps behind, not the full decay's 9)
        assert 2.5 < (dict(layer.named_parameters())[name] - p).mean() < 4
    assert averaged is not layer and torch.allclose(layer.weight, start["weight"] + 30)  # the live module untouched

    restored = ParameterAverage(torch.nn.Linear(3, 2), 0.9)
    restored.load_state_dict(average.state_dict())
    assert restored.updates == 30 and all(torch.equal(restored.average[k], v) for k, v in average.average.items())
    with pytest.raises(CheckpointError, match="does not match"):
        ParameterAverage(torch.nn.Linear(4, 2), 0.9).load_state_dict(average.state_dict())
    with pytest.raises(InputError, match="decay"):
        ParameterAverage(layer, 1.0)


def test_resume_loads_a_saved_average_or_restarts_from_the_weights():
    layer = torch.nn.Linear(3, 2)
    average = ParameterAverage(layer, 0.9)
    for _ in range(5):
        with torch.no_grad():
            layer.weight.add_(1.0)
        average.update(layer)
    saved = average.state_dict()

    resumed = ParameterAverage(torch.nn.Linear(3, 2), 0.9)
    resumed.resume(saved, layer)  # a checkpoint with an average: that average
    assert resumed.updates == 5 and all(torch.equal(resumed.average[k], v) for k, v in average.average.items())
    resumed.resume(None, layer)  # one without: the module's current weights, from the first update again
    assert resumed.updates == 0
    assert all(torch.equal(resumed.average[k], p) for k, p in layer.named_parameters())
    with pytest.raises(CheckpointError, match="do not match"):
        resumed.resume(None, torch.nn.Linear(4, 2))
