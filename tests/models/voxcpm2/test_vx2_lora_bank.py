"""Per-request LoRA adapters (``models/voxcpm2/lora_bank.py``) on the fixture's ``tiny_model/``: the per-row math
equals applying each adapter alone, and requests with two adapters and none, batched in one scheduler step, give
what each gives alone with the model-wide adapter (``load_lora``, whose parity with the reference the LoRA tests
check) or no adapter.

Fixtures: ``$CADENZA_FIXTURES_VOXCPM2`` (default ``<repo>/../shared/fixtures/voxcpm2``); skipped when absent.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import CheckpointError, LoRAInUseError, UnknownLoRAError
from cadenza.models.voxcpm2.loader import load_model
from cadenza.models.voxcpm2.lora import LoRAConfig
from cadenza.models.voxcpm2.lora_bank import LoRABank, lora_rows
from helpers import assert_close
from vx2_lora_helpers import make_adapter

# Per-row products see other row counts than the model-wide LoRALinear of a request alone (GEMMs sum in another
# order): ~1e-7 per product in float32, measured below 1e-6 on whole waveforms here.
ROW_TOL = 1e-5
TIMEOUT = 120


@pytest.fixture(scope="module", autouse=True)
def _requires_tiny_lora(vx2_dir: Path) -> None:
    """Every test here needs the fixture's ``tiny_lora/`` adapter as well as the shared folder (tests/conftest.py)."""
    if not (vx2_dir / "tiny_lora" / "lora_config.json").is_file():
        pytest.skip(f"VoxCPM 2 fixtures with tiny_lora/ not found at {vx2_dir} (set CADENZA_FIXTURES_VOXCPM2)")


@pytest.fixture(scope="module")
def second_lora(vx2_dir, tmp_path_factory) -> Path:
    return make_adapter(vx2_dir / "tiny_model", tmp_path_factory.mktemp("lora") / "b")


def _alone(x: torch.Tensor, module, folder: Path, layer: str) -> torch.Tensor:
    """The adapter of ``folder`` on ``x`` as ``LoRALinear`` computes it: ``x Wᵀ + (x Aᵀ) Bᵀ · alpha / r``."""
    config = LoRAConfig.from_json(folder / "lora_config.json")
    state = load_file(str(folder / "lora_weights.safetensors"))
    base = F.linear(x, module.weight, module.bias)
    if f"{layer}.lora_A" not in state:
        return base
    return base + F.linear(F.linear(x, state[f"{layer}.lora_A"]), state[f"{layer}.lora_B"]) * config.scaling


def test_per_row_math_equals_each_adapter_alone(vx2_dir, second_lora):
    model = load_model(vx2_dir / "tiny_model", dtype=torch.float32)
    bank = LoRABank(model)
    a = bank.add_folder("a", vx2_dir / "tiny_lora")
    b = bank.add_folder("b", second_lora)
    folders = {"a": vx2_dir / "tiny_lora", "b": second_lora}
    gen = torch.Generator().manual_seed(0)
    for layer in ("base_lm.layers.0.self_attn.q_proj", "feat_decoder.estimator.decoder.layers.1.self_attn.v_proj",
                  "lm_to_dit_proj"):  # both adapters / only a (b has no DiT) / a projection
        module = model.get_submodule(layer)
        x = torch.randn(4, 3, module.in_features, generator=gen)
        rows = [a, None, b, a]
        with torch.inference_mode():
            base = module(x)
            with lora_rows(rows):
                mixed = module(x)
                doubled = module(torch.cat([x, x]))  # the flow sampler's [conditional; unconditional] batch
        assert torch.equal(mixed[1], base[1])  # no adapter: the base layer, bit for bit
        for i, adapter in enumerate(rows):
            if adapter is not None:
                expected = _alone(x[i], module, folders[adapter.name], layer).detach()
                assert_close(mixed[i], expected, 1e-6, f"{layer} row {i} ({adapter.name})")
                assert_close(doubled[i + 4], expected, 1e-6, f"{layer} doubled row {i}")
        if layer.startswith("base_lm"):  # both adapters change this layer, differently
            assert (mixed[0] - base[0]).abs().max() > 1e-3 and (mixed[2] - base[2]).abs().max() > 1e-3
        else:
            assert torch.equal(mixed[2], base[2])  # b does not target it
    with torch.inference_mode(), lora_rows([a, b, None]):
        with pytest.raises(RuntimeError, match="4 rows for 3"):
            model.lm_to_dit_proj(torch.zeros(4, model.lm_to_dit_proj.in_features))
    bank.remove("a")
    bank.remove("b")
    assert not model.base_lm.layers[0].self_attn.q_proj._forward_hooks  # no hook left behind


def test_bank_refuses_bad_adapters(vx2_dir, second_lora, tmp_path):
    model = load_model(vx2_dir / "tiny_model", dtype=torch.float32)
    bank = LoRABank(model, max_adapters=2)
    config, state = LoRAConfig.from_json(second_lora / "lora_config.json"), load_file(
        str(second_lora / "lora_weights.safetensors"))
    for name in ("", "a/b", "../x", "x" * 65, "a:b", " a"):
        with pytest.raises(CheckpointError, match="bad LoRA adapter name"):
            bank.add(name, config, state)
    key = next(iter(state))
    with pytest.raises(CheckpointError, match=r"missing LoRA keys \(1\)"):
        bank.add("x", config, {k: v for k, v in state.items() if k != key})
    with pytest.raises(CheckpointError, match="shape mismatches"):
        bank.add("x", config, {**state, key: state[key][:1]})
    with pytest.raises(CheckpointError, match="not finite"):
        bank.add("x", config, {**state, key: state[key] * float("nan")})
    with pytest.raises(CheckpointError, match="unknown LoRA keys"):
        bank.add("x", LoRAConfig(enable_lm=True, r=2, alpha=4, target_modules_lm=("q_proj",)), state)
    bank.add("one", config, state)
    with pytest.raises(CheckpointError, match="already registered"):
        bank.add("one", config, state)
    bank.add("two", config, state)
    with pytest.raises(CheckpointError, match="holds 2 LoRA adapters"):
        bank.add("three", config, state)
    with pytest.raises(UnknownLoRAError, match="registered: one, two"):
        bank.get("nope")
    assert len(bank) == 2


@pytest.fixture(scope="module")
def engines(vx2_dir, second_lora):
    """One engine serving both adapters per request (one worker: every request shares its steps), and the
    reference for each alone: the model-wide adapter loaded into an engine of its own."""
    served = VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model", scheduler=SchedulerConfig(vocoder_workers=1))
    served.register_lora("a", vx2_dir / "tiny_lora")
    served.register_lora("b", second_lora)
    alone = {None: VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model"),
             "a": VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model", lora=vx2_dir / "tiny_lora"),
             "b": VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model", lora=second_lora)}
    yield served, alone
    for engine in (served, *alone.values()):
        engine.close()


def test_batched_adapters_equal_each_alone(engines):
    served, alone = engines
    cases = [("Hello, this is a test.", "a", True), ("Hello, this is a test.", "b", False),
             ("Hello, this is a test.", None, True), ("Hello the world.", "a", False)]
    expected = []
    for text, name, _ in cases:
        request = alone[name].build(text, seed=3, retry=False, max_len=12)
        expected.append((alone[name].synthesize(request), request.outcome.attempts[0].n_patches))
    requests = [served.build(text, seed=3, retry=False, max_len=12, lora=name) for text, name, _ in cases]
    with served.scheduler.exclusive():  # all queued before the first step: they run as one batch
        handles = [served.scheduler.submit(r, stream=s) for r, (_, _, s) in zip(requests, cases)]
    got = [np.concatenate(list(h)) for h in handles]
    assert served.scheduler.max_batch == len(cases)
    for (_, name, _), (wav, n), request, out in zip(cases, expected, requests, got):
        assert request.outcome.attempts[0].n_patches == n
        assert_close(out, wav, ROW_TOL, f"{name} batched vs alone")
    # The adapters matter: the same text and seed sound different with each
    for i in (0, 1):
        n = min(got[i].size, got[2].size)
        assert np.abs(got[i][:n] - got[2][:n]).max() > 1e-3


def test_unknown_and_removed_adapters(engines, second_lora):
    served, _ = engines
    with pytest.raises(UnknownLoRAError, match="no LoRA adapter 'c' on this model; registered: a, b"):
        served.build("Hello.", lora="c")
    served.register_lora("c", second_lora)
    request = served.build("Hello, this is a test.", seed=1, lora="c", retry=False, max_len=40)
    stream = served.stream(request)
    next(stream)  # running
    with pytest.raises(LoRAInUseError, match="in use by 1 request"):
        served.unregister_lora("c")
    stream.close()
    deadline = time.monotonic() + TIMEOUT
    while served.scheduler.load != (0, 0):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    built = served.build("Hello.", lora="c")
    served.unregister_lora("c")
    assert served.loras.names == ["a", "b"]
    with pytest.raises(UnknownLoRAError, match="was removed"):
        served.synthesize(built)
    assert served.synthesize(served.build("Hi.", seed=2, lora="a", max_len=4)).size > 0
