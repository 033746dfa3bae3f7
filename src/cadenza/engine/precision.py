"""Which parts of a CosyVoice 2 model compute in what precision, chosen by what the hardware does fast.

The flow (encoder + CFM estimator, 10 Euler steps with CFG) and HiFT's convolution stack are nearly all of a
request's work on a CPU, and they are matrix products and convolutions: a CPU with AMX or AVX-512 BF16 runs those
several times faster in bfloat16, while an AVX2-only CPU emulates bfloat16 and gets slower. ``Precision.choose``
decides per component; measured speed and accuracy: docs/performance.md, "CPU fast path".

* ``float32`` is the parity mode: nothing is converted, the computation is bit for bit the float32 one.
* ``bfloat16`` runs the flow encoder, the estimator and HiFT's convolution stack in bfloat16. What would shift the
  output as a whole stays float32: the ODE state of the Euler steps and the time embedding's input, the token and
  speaker embeddings and projections, HiFT's f0 predictor, harmonic source and STFTs. The LM stays float32 (at
  batch 1 its decode step reads every weight once; bfloat16 was slower there, and changed greedy tokens).
* ``lm_int8`` (opt-in, CPU only) stores the LM's linear layers' weights as int8: on a CPU with fast bfloat16 as
  int8 weights times bfloat16 activations (``layers/int8_linear.py``: the weights alone are rounded), elsewhere by
  dynamic quantization (int8 weights, activations quantized per call: a larger error).
* ``flow_int8`` (opt-in, CPU only, with a float32 flow) quantizes the CFM estimator's linear layers dynamically (int8
  per-channel weights, activations per call): for CPUs without fast bfloat16 (AVX2), where the flow is otherwise at
  the reference's float32 speed. Where bfloat16 is fast, the ``bfloat16`` flow is the faster choice.
* ``auto``: ``bfloat16`` on a CPU with AMX-BF16 or AVX-512 BF16 and on a CUDA device with bfloat16 support,
  ``float32`` anywhere else.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cadenza.errors import InputError
from cadenza.layers.int8_linear import int8_weight_linears, int8_weights_supported

if TYPE_CHECKING:
    from cadenza.models.cosyvoice2.model import CosyVoice2Model

log = logging.getLogger(__name__)

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_COMPUTE_DTYPES = (torch.float32, torch.bfloat16)
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuCapability:
    """What this CPU computes fast. ``model_name``: as /proc/cpuinfo names it ("" when unknown)."""

    model_name: str = ""
    amx_bf16: bool = False
    avx512_bf16: bool = False
    avx2: bool = False

    @property
    def fast_bf16(self) -> bool:
        """bfloat16 matrix products run in hardware (AMX tiles or AVX-512 BF16 dot products), not emulated."""
        return self.amx_bf16 or self.avx512_bf16

    def describe(self) -> str:
        isa = "AMX-BF16" if self.amx_bf16 else "AVX-512 BF16" if self.avx512_bf16 else "AVX2" if self.avx2 else "?"
        return f"{self.model_name or 'unknown CPU'} ({isa})"


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first processor in /proc/cpuinfo; ("", empty) where there is none (not Linux)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", set()
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if name and flags:
            break
    return name, flags


def _torch_cpu_check(name: str) -> bool:
    """torch's own cpuinfo checks (``torch.cpu._is_*_supported``; private, so missing ones count as False)."""
    check = getattr(torch.cpu, name, None)
    try:
        return bool(check()) if callable(check) else False
    except Exception:  # noqa: BLE001 - a private helper that may change: absence of evidence, not an error
        return False


@functools.cache
def detect_cpu() -> CpuCapability:
    """This machine's CPU capability: /proc/cpuinfo's flags, else torch's cpuinfo checks (macOS, Windows)."""
    name, flags = _cpuinfo()
    if flags:
        return CpuCapability(name, "amx_bf16" in flags, "avx512_bf16" in flags, "avx2" in flags)
    return CpuCapability(name, _torch_cpu_check("_is_amx_tile_supported"),
                         _torch_cpu_check("_is_avx512_bf16_supported"), _torch_cpu_check("_is_avx2_supported"))


def _dtype_name(dtype: torch.dtype) -> str:
    return "bfloat16" if dtype == torch.bfloat16 else "float32"


@dataclass(frozen=True)
class Precision:
    """Per component precision of a CosyVoice 2 model.

    ``flow``: dtype of the flow encoder and the CFM estimator; ``hift``: dtype of HiFT's convolution stack (both
    float32 or bfloat16; the tensors passed between components stay float32); ``lm_int8``: the LM's linear layers
    with int8 weights (CPU only; ``lm_int8_scheme``); ``flow_int8``: the CFM estimator's linear layers dynamically
    quantized to int8 (CPU only; ``flow`` must be float32).
    """

    flow: torch.dtype = torch.float32
    hift: torch.dtype = torch.float32
    lm_int8: bool = False
    flow_int8: bool = False

    def __post_init__(self) -> None:
        for name in ("flow", "hift"):
            value = getattr(self, name)
            if value not in _COMPUTE_DTYPES:
                raise InputError(f"Precision.{name} must be torch.float32 or torch.bfloat16, not {value!r}")
        for name in ("lm_int8", "flow_int8"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"Precision.{name} must be True or False, not {getattr(self, name)!r}")
        if self.flow_int8 and self.flow != torch.float32:
            raise InputError("Precision.flow_int8 quantizes a float32 flow: it cannot be combined with a bfloat16 flow "
                             "(where bfloat16 is fast, the bfloat16 flow is the faster choice)")

    @classmethod
    def bfloat16(cls, lm_int8: bool = False) -> Precision:
        """The fast path: flow and HiFT in bfloat16, the LM in float32 (or int8)."""
        return cls(torch.bfloat16, torch.bfloat16, lm_int8)

    @property
    def is_float32(self) -> bool:
        """Nothing converted: the parity mode."""
        return self == Precision()

    @classmethod
    def choose(cls, dtype: str | torch.dtype | Precision = "auto", device: str | torch.device = "cpu",
               lm_int8: bool = False, cpu: CpuCapability | None = None, flow_int8: bool = False) -> Precision:
        """The precision for ``dtype`` on ``device``.

        ``dtype``: ``"auto"`` (by the hardware, see the module docstring), ``"float32"`` / ``torch.float32`` (the
        parity mode), ``"bfloat16"`` / ``torch.bfloat16`` (the fast path whatever the hardware), or a
        ``Precision`` (taken as it is). ``lm_int8``: also quantize the LM (CPU only). ``flow_int8``: the flow in
        float32 with int8 linear layers (CPU only; HiFT still follows ``dtype``). ``cpu``: the capability to decide
        by (default: this machine's, ``detect_cpu()``). Anything else is an ``InputError`` naming the choices.
        """
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise InputError(f"not a torch device: {str(device)[:80]!r}") from exc
        if isinstance(dtype, Precision):
            chosen = dtype
        else:
            compute = cls._compute_dtype(dtype, device, cpu)
            chosen = cls(compute, compute)
        if lm_int8 or flow_int8:
            flow = torch.float32 if flow_int8 else chosen.flow
            chosen = cls(flow, chosen.hift, chosen.lm_int8 or bool(lm_int8), chosen.flow_int8 or bool(flow_int8))
        for name, part in (("lm_int8", "LM"), ("flow_int8", "flow")):
            if getattr(chosen, name) and device.type != "cpu":
                raise InputError(f"the int8 {part} ({name}) runs on the CPU only, not on {device}")
        return chosen

    @staticmethod
    def _compute_dtype(dtype: object, device: torch.device, cpu: CpuCapability | None) -> torch.dtype:
        if isinstance(dtype, str) and dtype.strip().lower() == "auto":
            if device.type == "cpu":
                return torch.bfloat16 if (cpu or detect_cpu()).fast_bf16 else torch.float32
            if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
                return torch.bfloat16
            return torch.float32
        if isinstance(dtype, str) and dtype.strip().lower() in _DTYPE_NAMES:
            return _DTYPE_NAMES[dtype.strip().lower()]
        if isinstance(dtype, torch.dtype) and dtype in _COMPUTE_DTYPES:
            return dtype
        shown = repr(dtype)[:80]
        raise InputError(f"dtype must be one of {', '.join(DTYPE_CHOICES)} (or torch.float32 / torch.bfloat16, or a "
                         f"Precision), got {shown}")

    def describe(self) -> str:
        """e.g. ``flow bfloat16, HiFT bfloat16, LM float32``."""
        lm = f"int8 ({lm_int8_scheme()})" if self.lm_int8 else "float32"
        flow = "float32 + int8 linear layers (dynamic)" if self.flow_int8 else _dtype_name(self.flow)
        return f"flow {flow}, HiFT {_dtype_name(self.hift)}, LM {lm}"


def apply_precision(model: CosyVoice2Model, precision: Precision) -> CosyVoice2Model:
    """Convert ``model`` in place to ``precision`` (one way: float32 weights that become bfloat16 or int8 are not
    kept) and return it. ``Precision()`` (float32) leaves it untouched. Call it once, on a float32 model in eval
    mode, before any request."""
    if precision.is_float32:
        return model
    if model.training:
        raise InputError("the fast path is for inference: call model.eval() first")
    if precision.flow != torch.float32:
        model.flow.set_compute_dtype(precision.flow)
    if precision.hift != torch.float32:
        model.hift.set_compute_dtype(precision.hift)
    if precision.lm_int8:
        model.lm = quantize_lm(model.lm)
    if precision.flow_int8:
        quantize_flow(model.flow)
    return model


def lm_int8_scheme(cpu: CpuCapability | None = None) -> str:
    """How ``lm_int8`` quantizes on this CPU: ``"weights"`` (int8 weights x bfloat16 activations, where bfloat16 is
    fast and torch has the product) or ``"dynamic"`` (torch's dynamic quantization)."""
    return "weights" if (cpu or detect_cpu()).fast_bf16 and int8_weights_supported() else "dynamic"


def quantize_lm(lm: torch.nn.Module, cpu: CpuCapability | None = None) -> torch.nn.Module:
    """Every ``nn.Linear`` of ``lm`` (attention, MLP, the speech-token head) with int8 weights, by
    ``lm_int8_scheme(cpu)``: per-channel int8 weights either way; activations bfloat16 (``"weights"``) or quantized
    per call (``"dynamic"``). Embeddings stay float32."""
    if lm_int8_scheme(cpu) == "weights":
        return int8_weight_linears(lm)
    return _quantize_dynamic(lm, lambda name: True)


def quantize_flow(flow: torch.nn.Module) -> torch.nn.Module:
    """The linear layers of ``flow``'s CFM estimator (every transformer block's attention and feed-forward, the
    resnet blocks' time projections) by dynamic int8 quantization, in place: per-channel int8 weights, activations
    quantized per call. The time embedding MLP stays float32 (its output shifts every layer's input, and it is one
    row per step: nothing to gain), as do the encoder (run once per chunk, a few % of the flow) and the convolutions.
    Returns ``flow``."""
    _quantize_dynamic(flow.decoder.estimator, lambda name: not name.startswith("time_mlp"))
    return flow


def _quantize_dynamic(module: torch.nn.Module, wanted) -> torch.nn.Module:
    """torch's dynamic quantization (per-channel int8 weights, activations per call), in place, of the ``nn.Linear``
    layers of ``module`` whose qualified name ``wanted(name)`` accepts. Returns ``module``."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {name: per_channel_dynamic_qconfig for name, layer in module.named_modules()
            if isinstance(layer, torch.nn.Linear) and wanted(name)}
    with warnings.catch_warnings():
        # torch 2.10+ announces the move of eager-mode quantization to torchao; the API still works and is what a
        # plain torch install has.
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, spec, inplace=True)
