"""CosyVoice 2 precision (engine/precision.py; docs/performance.md, "CPU fast path"): the choice follows the CPU's
capability, float32 stays bit for bit what it was, bfloat16 stays close to it, and the CLI takes --dtype."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch import nn

from cadenza.audio.mel import flow_prompt_mel
from cadenza.cli.args import DTYPES, precision_arguments
from cadenza.cli.main import build_parser
from cadenza.engine import precision as precision_module
from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.precision import (
    DTYPE_CHOICES,
    CpuCapability,
    Precision,
    apply_precision,
    detect_cpu,
    lm_int8_scheme,
)
from cadenza.errors import CadenzaError, InputError
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.models.cosyvoice2.speakers import SpeakerStore

from small_model import small_model, voice

AMX = CpuCapability("Sapphire Rapids", amx_bf16=True, avx512_bf16=True, avx2=True)
AVX512_BF16 = CpuCapability("Zen 4", amx_bf16=False, avx512_bf16=True, avx2=True)
AVX2 = CpuCapability("Haswell", avx2=True)
# Measured on the small test model (tests/small_model.py), seeds 0-3: mel 44.8-45.6 dB, HiFT 35.8-35.9 dB,
# incremental flow 39.9-40.9 dB; the bounds leave ~7-8 dB for other CPUs' bf16 kernels.
MEL_SNR_DB, WAVE_SNR_DB, INCREMENTAL_SNR_DB = 37.0, 28.0, 32.0


def snr_db(actual: torch.Tensor | np.ndarray, reference: torch.Tensor | np.ndarray) -> float:
    a = torch.as_tensor(actual).double()
    r = torch.as_tensor(reference).double()
    return float(10 * torch.log10((r**2).sum() / ((a - r) ** 2).sum().clamp(min=1e-30)))


def chunked_flow_snr(m32, fast, tokens: torch.Tensor, v) -> float:
    """SNR of ``fast``'s cached, chunked flow (a 25-token chunk with 3 look-ahead, then the rest) against the float32
    model's streamed (chunk-masked) flow of the same tokens."""
    streamed32 = m32.flow.inference(tokens, v.flow_prompt_speech, v.prompt_mel, v.embedding, streaming=True)
    with IncrementalFlow(fast.flow, v.flow_prompt_speech, v.prompt_mel, v.embedding) as session:
        first = session.push(tokens[:, :25], tokens[:, 25:28])
        rest = session.push(tokens[:, 25:], None, final=True)
    return snr_db(torch.cat([first, rest], dim=2), streamed32)


@pytest.fixture(scope="module")
def models():
    """(float32, bfloat16) copies of the same small model."""
    return small_model(), apply_precision(small_model(), Precision.bfloat16())


# -- choosing ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cpu, expected", [(AMX, torch.bfloat16), (AVX512_BF16, torch.bfloat16),
                                           (AVX2, torch.float32), (CpuCapability(), torch.float32)])
def test_auto_follows_the_cpu_capability(cpu, expected):
    chosen = Precision.choose("auto", "cpu", cpu=cpu)
    assert chosen.flow == chosen.hift == expected and not chosen.lm_int8


def test_auto_uses_the_detected_cpu(monkeypatch):
    monkeypatch.setattr(precision_module, "detect_cpu", lambda: AVX2)
    assert Precision.choose("auto") == Precision()
    monkeypatch.setattr(precision_module, "detect_cpu", lambda: AMX)
    assert Precision.choose("auto") == Precision.bfloat16()
    assert Precision.choose("float32") == Precision()  # an explicit choice is never overridden
    monkeypatch.setattr(precision_module, "detect_cpu", lambda: AVX2)
    assert Precision.choose("bfloat16") == Precision.bfloat16()


def test_detection_reads_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 "
                    "amx_tile\n\nprocessor\t: 1\nmodel name\t: Test CPU\nflags\t\t: fpu\n")
    monkeypatch.setattr(precision_module, "CPUINFO", info)
    detect_cpu.cache_clear()
    try:
        assert detect_cpu() == CpuCapability("Test CPU", amx_bf16=True, avx512_bf16=True, avx2=True)
        info.write_text("processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: fpu sse avx2 fma\n")
        detect_cpu.cache_clear()
        cpu = detect_cpu()
        assert cpu.avx2 and not cpu.fast_bf16 and "Old CPU (AVX2)" == cpu.describe()
    finally:
        detect_cpu.cache_clear()


@pytest.mark.parametrize("value, expected", [
    ("float32", Precision()), ("fp32", Precision()), (torch.float32, Precision()), (" Float32 ", Precision()),
    ("bfloat16", Precision.bfloat16()), ("bf16", Precision.bfloat16()), (torch.bfloat16, Precision.bfloat16()),
    (Precision(hift=torch.bfloat16), Precision(hift=torch.bfloat16)),
])
def test_dtype_values(value, expected):
    assert Precision.choose(value, "cpu") == expected


@pytest.mark.parametrize("value", ["fp16", "float16", torch.float16, torch.int8, "", None, 3])
def test_bad_dtypes_are_refused_naming_the_choices(value):
    with pytest.raises(InputError, match="dtype must be one of auto, float32, bfloat16"):
        Precision.choose(value, "cpu")


def test_precision_checks_itself():
    with pytest.raises(InputError, match="Precision.flow must be torch.float32 or torch.bfloat16"):
        Precision(flow=torch.float16)
    with pytest.raises(InputError, match="lm_int8 must be True or False"):
        Precision(lm_int8=1)
    with pytest.raises(InputError, match="CPU only"):
        Precision.choose("float32", "cuda", lm_int8=True)
    with pytest.raises(InputError, match="not a torch device"):
        Precision.choose("float32", "no-such-device")
    assert Precision.choose(Precision.bfloat16(), "cpu", lm_int8=True) == Precision.bfloat16(lm_int8=True)
    assert Precision.bfloat16(lm_int8=True).describe() == f"flow bfloat16, HiFT bfloat16, LM int8 ({lm_int8_scheme()})"


def test_flow_int8_is_a_float32_flow_on_the_cpu():
    with pytest.raises(InputError, match="flow_int8 must be True or False"):
        Precision(flow_int8="yes")
    with pytest.raises(InputError, match="cannot be combined with a bfloat16 flow"):
        Precision(flow=torch.bfloat16, flow_int8=True)
    with pytest.raises(InputError, match="int8 flow \\(flow_int8\\) runs on the CPU only"):
        Precision.choose("float32", "cuda", flow_int8=True)
    # An explicit --flow-int8 wins over a bfloat16 flow; HiFT keeps what dtype chose.
    chosen = Precision.choose("auto", "cpu", cpu=AMX, flow_int8=True)
    assert chosen == Precision(torch.float32, torch.bfloat16, flow_int8=True)
    assert Precision.choose("auto", "cpu", cpu=AVX2, flow_int8=True, lm_int8=True) == Precision(lm_int8=True,
                                                                                              flow_int8=True)
    assert Precision.choose(chosen, "cpu", lm_int8=True) == Precision(torch.float32, torch.bfloat16, True, True)
    assert chosen.describe() == "flow float32 + int8 linear layers (dynamic), HiFT bfloat16, LM float32"
    assert not Precision(flow_int8=True).is_float32


# -- float32 is untouched ---------------------------------------------------------------------------------------
def _engine(model, precision=None) -> CosyVoice2Engine:
    return CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), precision=precision)


def _request(engine, seed: int = 3, tokens: int = 40):
    text = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(seed))
    req = engine.build(text_ids=text, voice=voice(engine.model, 10, seed), mode="test", seed=seed)
    req.min_tokens = req.max_tokens = tokens
    return req


def test_float32_is_bit_for_bit_unchanged():
    plain, explicit = _engine(small_model()), _engine(small_model(), Precision.choose("float32"))
    try:
        assert explicit.precision.is_float32
        state = explicit.model.state_dict()
        assert all(v.dtype != torch.bfloat16 for v in state.values())
        for key, value in plain.model.state_dict().items():
            assert torch.equal(value, state[key]), key
        np.testing.assert_array_equal(plain.synthesize_direct(_request(plain)),
                                      explicit.synthesize_direct(_request(explicit)))
        np.testing.assert_array_equal(np.concatenate(list(plain.stream_direct(_request(plain)))),
                                      np.concatenate(list(explicit.stream_direct(_request(explicit)))))
    finally:
        plain.close()
        explicit.close()


# -- bfloat16 is close ------------------------------------------------------------------------------------------
def test_bfloat16_converts_only_the_heavy_parts(models):
    _, m16 = models
    assert m16.flow.compute_dtype == m16.flow.decoder.compute_dtype == m16.hift.compute_dtype == torch.bfloat16
    assert m16.flow.encoder.embed.out[0].weight.dtype == torch.bfloat16
    # What shifts the output as a whole stays float32: embeddings, projections, f0, source, STFT window, the LM.
    for module in (m16.flow.input_embedding, m16.flow.spk_embed_affine_layer, m16.flow.encoder_proj,
                   m16.hift.f0_predictor, m16.hift.m_source, m16.lm):
        assert all(p.dtype == torch.float32 for p in module.parameters())
    assert m16.hift.stft_window.dtype == m16.flow.decoder.rand_noise.dtype == torch.float32


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_flow_and_hift_are_close_to_float32(models, seed):
    m32, m16 = models
    v = voice(m32, 10, seed)
    tokens = torch.randint(0, m32.config.flow.vocab_size, (1, 60), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        mel32 = m32.flow.inference(tokens, v.flow_prompt_speech, v.prompt_mel, v.embedding)
        mel16 = m16.flow.inference(tokens, v.flow_prompt_speech, v.prompt_mel, v.embedding)
        assert mel16.dtype == torch.float32
        assert snr_db(mel16, mel32) >= MEL_SNR_DB
        wav32, _ = m32.hift.inference(mel32, generator=torch.Generator().manual_seed(seed))
        wav16, source16 = m16.hift.inference(mel32, generator=torch.Generator().manual_seed(seed))
        assert wav16.dtype == source16.dtype == torch.float32
        assert snr_db(wav16, wav32) >= WAVE_SNR_DB
        # The cached, chunked flow runs in bfloat16 too (its caches hold bfloat16 keys: half the memory).
        assert chunked_flow_snr(m32, m16, tokens, v) >= INCREMENTAL_SNR_DB


def test_bfloat16_engine_speaks_like_float32():
    e32, e16 = _engine(small_model()), _engine(small_model(), Precision.bfloat16())
    try:
        assert e16.precision == Precision.bfloat16()
        whole32, whole16 = e32.synthesize_direct(_request(e32)), e16.synthesize_direct(_request(e16))
        assert whole16.dtype == np.float32 and whole16.shape == whole32.shape  # the LM (float32) made the same tokens
        assert snr_db(whole16, whole32) >= WAVE_SNR_DB - 3  # flow and HiFT errors add up
        streamed = np.concatenate(list(e16.scheduler.submit(_request(e16), stream=True)))
        assert streamed.shape == whole32.shape and np.isfinite(streamed).all()
    finally:
        e32.close()
        e16.close()


def test_bfloat16_concurrent_streams_batch_like_float32():
    """Batched flow pushes and HiFT calls of concurrent streams (the scheduler's) in bfloat16: each stream stays as
    close to its float32 stream as alone (measured 35.8-35.9 dB, batched against alone 44-inf dB)."""
    from cadenza.engine.scheduler import SchedulerConfig

    def engine(precision):
        return CosyVoice2Engine(small_model(), frontend=None, speakers=SpeakerStore(None), precision=precision,
                                scheduler_config=SchedulerConfig(max_active=4))

    e32, e16 = engine(None), engine(Precision.bfloat16())
    try:
        handles = [e16.scheduler.submit(_request(e16, seed, 50), stream=True) for seed in range(3)]
        outs: list = [None] * 3

        def consume(i: int) -> None:
            outs[i] = np.concatenate(list(handles[i]))

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        for seed, out in enumerate(outs):
            reference = np.concatenate(list(e32.stream_direct(_request(e32, seed, 50))))
            assert out is not None and out.shape == reference.shape
            assert snr_db(out, reference) >= WAVE_SNR_DB
    finally:
        e32.close()
        e16.close()


def test_int8_lm_replaces_the_linear_layers_and_decodes():
    engine = _engine(small_model(), Precision(lm_int8=True))
    try:
        lm = engine.model.lm
        assert not any(type(m) is nn.Linear for m in lm.modules())  # noqa: E721 - exactly the float class
        assert all(p.dtype == torch.float32 for p in engine.model.flow.parameters())
        audio = engine.synthesize_direct(_request(engine))
        assert audio.size == 40 * engine.token2wav.hop and np.isfinite(audio).all()
    finally:
        engine.close()


# Measured on the small test model, seeds 0-3 (AMD EPYC, AVX2): whole mel 46.4-46.9 dB, cached chunked flow
# 39.6-41.2 dB against float32's streamed flow (10 Euler steps with CFG, every step through the quantized layers);
# the engine's waveforms 66-69 dB, whole and streamed. Bounds ~7-10 dB below for other CPUs' int8 kernels.
FLOW_INT8_MEL_SNR_DB, FLOW_INT8_STREAM_SNR_DB, FLOW_INT8_WAVE_SNR_DB = 39.0, 32.0, 55.0


@pytest.mark.parametrize("seed", [0, 1])
def test_int8_flow_quantizes_the_estimator_and_stays_close(seed):
    m32, m8 = small_model(), apply_precision(small_model(), Precision(flow_int8=True))
    estimator = m8.flow.decoder.estimator
    linears = {name: type(m) for name, m in estimator.named_modules() if "Linear" in type(m).__name__}
    quantized = [name for name, kind in linears.items() if kind is not nn.Linear]
    kept = [name for name, kind in linears.items() if kind is nn.Linear]
    assert quantized and all(name.startswith("time_mlp") for name in kept) and len(kept) == 2
    assert m8.flow.compute_dtype == m8.flow.decoder.compute_dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in [*m8.flow.encoder.parameters(), *m8.hift.parameters()])
    v = voice(m32, 10, seed)
    tokens = torch.randint(0, m32.config.flow.vocab_size, (1, 60), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        mel32 = m32.flow.inference(tokens, v.flow_prompt_speech, v.prompt_mel, v.embedding)
        mel8 = m8.flow.inference(tokens, v.flow_prompt_speech, v.prompt_mel, v.embedding)
        assert mel8.shape == mel32.shape and snr_db(mel8, mel32) >= FLOW_INT8_MEL_SNR_DB
        assert snr_db(mel8, mel32) < 200  # quantized: not the float32 computation itself
        assert chunked_flow_snr(m32, m8, tokens, v) >= FLOW_INT8_STREAM_SNR_DB


def test_int8_flow_engine_streams_like_float32():
    e32, e8 = _engine(small_model()), _engine(small_model(), Precision(flow_int8=True))
    try:
        whole32, whole8 = e32.synthesize_direct(_request(e32)), e8.synthesize_direct(_request(e8))
        assert whole8.shape == whole32.shape and FLOW_INT8_WAVE_SNR_DB <= snr_db(whole8, whole32) < 150
        streamed32 = np.concatenate(list(e32.scheduler.submit(_request(e32), stream=True)))
        streamed8 = np.concatenate(list(e8.scheduler.submit(_request(e8), stream=True)))
        assert streamed8.shape == streamed32.shape
        assert FLOW_INT8_WAVE_SNR_DB <= snr_db(streamed8, streamed32) < 150  # < 150: the int8 path did run
    finally:
        e32.close()
        e8.close()


def test_apply_precision_wants_an_eval_model():
    model = small_model().train()
    with pytest.raises(InputError, match="eval"):
        apply_precision(model, Precision.bfloat16())
    assert apply_precision(model, Precision()) is model  # float32: nothing to do, nothing refused


# -- the API and the command line -------------------------------------------------------------------------------
def test_from_pretrained_refuses_a_bad_dtype_before_loading(tmp_path):
    from cadenza.api import Cadenza

    with pytest.raises(InputError, match="dtype must be one of"):
        Cadenza.from_pretrained(tmp_path / "not-even-a-folder", dtype="half")


def test_builtin_model_in_bfloat16_is_close_to_float32():
    import cadenza

    with cadenza.load() as t32, cadenza.load(dtype="bfloat16") as t16:
        assert t32.engine.precision.is_float32 and t16.engine.precision == Precision.bfloat16()
        a = t32.synthesize("Hello there.", seed=4).samples
        b = t16.synthesize("Hello there.", seed=4).samples
        assert a.shape == b.shape
        # Compared as log-mel spectra, not waveforms: the vocoder's sine source integrates its f0 into a phase, so
        # the bf16 flow's slightly different mel (and f0) shifts the harmonics' phase over an utterance, which the
        # ear does not hear and a waveform SNR punishes (13.7 dB with the 2026-12-04 vocoder, whose source drives
        # its output; 28 dB with v1's, whose source was silent). Measured (docs/performance.md, "CPU fast path"):
        # 23.0 dB here, 26.1 on a longer sentence; v1's vocoder 21.6 / 25.5.
        mel = t32.engine.config.mel
        assert snr_db(*(flow_prompt_mel(torch.from_numpy(x)[None], mel) for x in (b, a))) >= 18.0


def test_cli_dtype_flag():
    parser = build_parser()
    assert DTYPES == DTYPE_CHOICES
    args = parser.parse_args(["synth", "--text", "hi", "-o", "x.wav"])
    assert args.dtype == "auto" and not args.lm_int8
    args = parser.parse_args(["synth", "--text", "hi", "-o", "x.wav", "--dtype", "float32", "--lm-int8"])
    assert args.dtype == "float32" and args.lm_int8 and not args.flow_int8
    assert parser.parse_args(["serve", "--flow-int8"]).flow_int8
    assert parser.parse_args(["serve", "--dtype", "bfloat16"]).dtype == "bfloat16"


@pytest.mark.parametrize("command", [["synth", "--text", "hi", "-o", "x.wav"], ["serve"]])
def test_cli_refuses_a_bad_dtype(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command, "--dtype", "fp16"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # argparse quotes the choices from Python 3.12.8 / 3.13.1 on
    assert "argument --dtype: invalid choice: 'fp16'" in err and all(d in err for d in DTYPES)


def test_cli_precision_arguments_for_each_family():
    assert precision_arguments(None, "auto") == {"dtype": "auto"}  # the built-in model is a CosyVoice 2
    assert precision_arguments(None, "float32") == {"dtype": "float32"}
    assert precision_arguments(None, None) == {}
    with_int8 = precision_arguments(None, "bfloat16", lm_int8=True)["dtype"]
    assert with_int8 == Precision.bfloat16(lm_int8=True)
    assert precision_arguments(None, "float32", flow_int8=True) == {"dtype": Precision(flow_int8=True)}


def test_cli_precision_arguments_for_voxcpm2(vx2_model_dir):
    assert precision_arguments(str(vx2_model_dir), "auto") == {}  # VoxCPM 2 chooses by device itself
    assert precision_arguments(str(vx2_model_dir), "bfloat16") == {"dtype": "bfloat16"}
    with pytest.raises(CadenzaError, match="--lm-int8 applies to CosyVoice 2 models only"):
        precision_arguments(str(vx2_model_dir), "auto", lm_int8=True)
    with pytest.raises(CadenzaError, match="--flow-int8 applies to CosyVoice 2 models only"):
        precision_arguments(str(vx2_model_dir), "auto", flow_int8=True)
