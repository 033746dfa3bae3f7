"""Growing a trained flow deeper (``flow.init_grown``): the new blocks start as the identity, so the deeper model
computes what the checkpoint did, and they still learn."""

from __future__ import annotations

import pytest
import torch

from cadenza.errors import CheckpointError, InputError
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.training.checkpoint import atomic_torch_save
from cadenza.training.flow_stage import FlowStage, FlowStageConfig
from cadenza.training.identity_blocks import start_as_identity
from cadenza.training.model_files import resolve_model

from small_model import small_training_model

NEW = ["decoder.estimator.mid_blocks.1.", "decoder.estimator.mid_blocks.2."]


def _model_config(mid_blocks: int) -> dict:
    return small_training_model(num_mid_blocks=mid_blocks)


@pytest.fixture(scope="module")
def shallow(tmp_path_factory):
    """A trained-looking 1-mid-block flow (random weights, non-trivial norms) saved as flow.pt in a folder."""
    torch.manual_seed(0)
    flow = TokenToMelFlow(resolve_model(_model_config(1)).config.flow)
    with torch.no_grad():
        for name, p in flow.named_parameters():
            if name.endswith(".weight") and p.dim() == 1:  # LayerNorm scales away from 1, as after training
                p.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("shallow")
    atomic_torch_save(flow.state_dict(), folder / "flow.pt")
    return flow.eval(), folder


def _estimator_inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    y, mu, cond = torch.randn(3, 2, 80, 24, generator=g).unbind(0)
    return y, torch.ones(2, 1, 24), mu, torch.rand(2, generator=g), torch.randn(2, 80, generator=g), cond


def _grown(shallow_folder, stage_data) -> TokenToMelFlow:
    config = {"model": _model_config(3), "flow": {"init_flow": str(shallow_folder), "init_grown": NEW},
              "train": {"max_steps": 1}}
    stage = FlowStage(config, stage_data)
    stage.setup(torch.device("cpu"), lambda m: m)
    return stage.flow.eval()


def test_a_grown_flow_computes_what_its_checkpoint_did(shallow, tmp_path):
    flow, folder = shallow
    grown = _grown(folder, tmp_path)
    assert len(grown.decoder.estimator.mid_blocks) == 3
    x = _estimator_inputs()
    with torch.no_grad():
        for streaming in (False, True):
            want = flow.decoder.estimator(*x, streaming=streaming)
            got = grown.decoder.estimator(*x, streaming=streaming)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # every tensor the checkpoint has is loaded unchanged
    for k, v in flow.state_dict().items():
        assert torch.equal(grown.state_dict()[k], v), k


def test_fresh_blocks_without_the_identity_start_change_the_output(shallow):
    """The check above can fail: the same growth with the new blocks left as initialised moves the output."""
    flow, folder = shallow
    torch.manual_seed(3)
    deeper = TokenToMelFlow(resolve_model(_model_config(3)).config.flow).eval()
    fresh = {k: v for k, v in deeper.state_dict().items() if any(k.startswith(p) for p in NEW)}
    deeper.load_state_dict({**flow.state_dict(), **fresh})
    x = _estimator_inputs()
    with torch.no_grad():
        gap = (deeper.decoder.estimator(*x) - flow.decoder.estimator(*x)).abs().max()
    assert gap > 1e-2


def test_the_new_blocks_learn(shallow, tmp_path):
    _, folder = shallow
    grown = _grown(folder, tmp_path).train()
    out = grown.decoder.estimator(*_estimator_inputs())
    out.square().mean().backward()
    block = grown.decoder.estimator.mid_blocks[2]
    resnet, transformer = block[0], block[1][0]
    for p in (resnet.block2.block[2].weight, transformer.attn1.to_out[0].weight, transformer.ff.net[2].weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_growth_names_only_blocks_that_can_start_as_the_identity(shallow):
    flow, _ = shallow
    with pytest.raises(CheckpointError, match="names no submodule"):
        start_as_identity(flow, ["decoder.estimator.mid_blocks.7."])
    with pytest.raises(CheckpointError, match="no residual block"):
        start_as_identity(flow, ["decoder.estimator.time_mlp."])
    with pytest.raises(InputError, match="init_grown needs flow.init_flow"):
        FlowStageConfig(init_grown=("decoder.estimator.mid_blocks.1.",))
