"""Int8-weight linear layers (layers/int8_linear.py) and the int8 LM built from them (engine/precision.py)."""

import pytest
import torch
import torch.nn as nn

from cadenza.engine.precision import CpuCapability, Precision, apply_precision, lm_int8_scheme, quantize_lm
from cadenza.layers.int8_linear import SMALL_ROWS, Int8WeightLinear, int8_weight_linears, int8_weights_supported

from small_model import small_model

pytestmark = pytest.mark.skipif(not int8_weights_supported(), reason="this torch lacks _weight_int8pack_mm")

AMX = CpuCapability("test CPU", amx_bf16=True, avx512_bf16=True, avx2=True)
AVX2 = CpuCapability("test CPU", avx2=True)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


@pytest.mark.parametrize("rows", [1, SMALL_ROWS, SMALL_ROWS + 1, 37])
def test_matches_the_float_layer_on_both_paths(rows):
    torch.manual_seed(0)
    linear = nn.Linear(96, 200)
    layer = Int8WeightLinear.from_linear(linear)
    x = torch.randn(2, rows, 96)
    with torch.no_grad():
        expected, actual = linear(x), layer(x)
    assert actual.shape == expected.shape == (2, rows, 200) and actual.dtype == torch.float32
    assert _relative_error(actual, expected) < 0.01


def test_int8_path_is_the_rounded_weights_product():
    torch.manual_seed(1)
    linear = nn.Linear(64, 48, bias=False)
    layer = Int8WeightLinear.from_linear(linear)
    dequantized = layer.weight_int8.float() * layer.scale.float()[:, None]
    assert (dequantized - linear.weight).abs().max() <= layer.scale.float().max() / 2 * 1.01  # half a step
    x = torch.randn(1, 64)
    with torch.no_grad():
        expected = x.bfloat16().float() @ dequantized.T
        assert _relative_error(layer(x), expected) < 0.01
        assert layer.bias is None


def test_more_accurate_than_dynamic_quantization():
    torch.manual_seed(2)
    linear = nn.Linear(512, 512)
    x = torch.randn(1, 512)
    with torch.no_grad():
        expected = linear(x)
        weights_only = _relative_error(Int8WeightLinear.from_linear(linear)(x), expected)
        dynamic = _relative_error(_dynamic(linear)(x), expected)
    assert weights_only < dynamic / 2


def _dynamic(linear: nn.Linear) -> nn.Module:
    copy = nn.Sequential(nn.Linear(linear.in_features, linear.out_features))
    copy[0].load_state_dict(linear.state_dict())
    return quantize_lm(copy, AVX2)


def test_replaces_nested_linears():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), nn.Linear(8, 4)), nn.Embedding(3, 8))
    int8_weight_linears(model)
    assert isinstance(model[0], Int8WeightLinear) and isinstance(model[1][1], Int8WeightLinear)
    assert isinstance(model[2], nn.Embedding)
    assert not any(type(m) is nn.Linear for m in model.modules())  # noqa: E721 - exactly the float class


def test_the_scheme_follows_the_cpu():
    assert lm_int8_scheme(AMX) == "weights" and lm_int8_scheme(AVX2) == "dynamic"
    lm = quantize_lm(nn.Sequential(nn.Linear(8, 8)), AMX)
    assert isinstance(lm[0], Int8WeightLinear)
    lm = quantize_lm(nn.Sequential(nn.Linear(8, 8)), AVX2)
    assert type(lm[0]).__module__.startswith("torch.ao.nn.quantized")


def test_int8_lm_stays_close_to_float32_teacher_forced():
    """The whole LM: log-probabilities of a teacher-forced sequence, int8 weights against float32."""
    torch.manual_seed(3)
    base = small_model().eval()
    quantized = apply_precision(small_model().eval(), Precision(lm_int8=True))
    if lm_int8_scheme() != "weights":
        quantized.lm = int8_weight_linears(small_model().eval().lm)
    text = torch.randint(0, 50, (1, 12))
    tokens = torch.randint(0, base.lm.cfg.speech_token_size, (20,)).tolist()
    with torch.inference_mode():
        steps = []
        for lm in (base.lm, quantized.lm):
            cache = lm.new_cache(64)
            out = [lm._step(lm.build_input(text), cache, None)]
            out += [lm._step(lm.speech_step_input(t), cache, None) for t in tokens]
            steps.append(torch.stack(out))
    probs32, probs8 = steps[0].exp(), steps[1].exp()
    assert (probs32 - probs8).abs().max() < 0.02
    assert (probs32 - probs8).abs().sum(-1).max() > 0  # it is quantized: not the float32 computation
