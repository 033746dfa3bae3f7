"""Hostile and broken model folders: every file is verified at load, and every failure is a ``CheckpointError`` that
names the file (and the key or shape); code in a pickle never runs; YAML aliases cannot blow up; a frontend model
that fails at run time is never reported as the client's fault.

Broken copies are built in ``tmp_path``: unchanged files are linked from the fixture (or the built-in model), the
file under test is written for real.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza import AudioError, Cadenza, CheckpointError, InputError
from cadenza.builtin import builtin_model_dir, parse_model_metadata, read_model_metadata
from cadenza.loading import load_into
from cadenza.models.cosyvoice2.config import CosyVoice2Config, Qwen2Config
from cadenza.models.cosyvoice2.loader import inspect_directory
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml
from cadenza.models.speaker_encoder import SpeakerEncoderConfig
from cadenza.models.speech_tokenizer import SpeechTokenizerConfig

from toy_model import build_toy_model_dir

WEIGHTS = ("llm.pt", "flow.pt", "hift.pt")


def _copy(src: Path, dst: Path, write: dict[str, bytes | str | None] | None = None) -> Path:
    """``dst`` with every file of ``src`` linked, except those in ``write``: bytes/str are written, None removes the
    file, ``"<dir>"`` puts a directory in its place."""
    write = write or {}
    for f in src.rglob("*"):
        if f.is_file():
            rel = f.relative_to(src).as_posix()
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            if rel not in write:
                os.symlink(f.resolve(), dst / rel)
    for rel, content in write.items():
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if content == "<dir>":
            target.mkdir()
        elif isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        elif content is not None:
            target.write_bytes(content)
    return dst


def _fixture_copy(cv2_dir: Path, dst: Path, write=None) -> Path:
    """The fixture's model files only (not its .npz test cases)."""
    src = dst.parent / (dst.name + "_src")
    (src / "CosyVoice-BlankEN").mkdir(parents=True)
    for rel in ("config.yaml", *WEIGHTS, "CosyVoice-BlankEN/config.json"):
        os.symlink(cv2_dir / rel, src / rel)
    return _copy(src, dst, write)


@pytest.fixture(scope="module")
def toy_src(cv2_dir, tmp_path_factory) -> Path:
    """The fixture + a BPE tokenizer + toy campplus.onnx / speech_tokenizer_v2.onnx (see toy_model.py)."""
    return build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")


def _load_fails(directory: Path, *needles: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as err:
        Cadenza.from_pretrained(directory).close()
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    return err.value


# -- pickles that would run code ---------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this runs ``touch MARKER`` (the classic pickle exploit)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", [*WEIGHTS, "spk2info.pt"])
@pytest.mark.parametrize("container", ["torch", "raw_pickle"])
def test_a_pickle_that_would_run_code_is_refused(cv2_dir, tmp_path, name, container):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    if container == "torch":
        torch.save({"weight": torch.zeros(2), "x": _Payload(marker)}, evil)
    else:
        evil.write_bytes(pickle.dumps({"x": _Payload(marker)}))
    # The payload is real: an unsafe load (in a child process) does create the marker.
    subprocess.run([sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=False)",
                    str(evil)], check=False, capture_output=True, cwd=tmp_path)
    assert marker.exists(), "the test payload should run under an unsafe load"
    marker.unlink()

    d = _fixture_copy(cv2_dir, tmp_path / "model", {name: evil.read_bytes()})
    err = _load_fails(d, name)
    assert "would run code" in str(err)
    assert not marker.exists()


# -- broken weight files -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", WEIGHTS)
@pytest.mark.parametrize(("damage", "needle"), [
    ("truncated", "truncated"),
    ("empty", "is empty (0 bytes)"),
    ("directory", "is a directory, not a file"),
    ("missing", "missing"),
    ("dangling_link", "does not exist"),
    ("not_a_state_dict", "does not hold a state dict"),
])
def test_broken_weight_files(cv2_dir, tmp_path, name, damage, needle):
    data = (cv2_dir / name).read_bytes()
    content = {"truncated": data[: len(data) // 2], "empty": b"", "directory": "<dir>", "missing": None,
               "dangling_link": None, "not_a_state_dict": None}[damage]
    d = _fixture_copy(cv2_dir, tmp_path / "model", {name: content})
    if damage == "dangling_link":
        os.symlink(tmp_path / "nowhere.pt", d / name)
    if damage == "not_a_state_dict":
        torch.save([torch.zeros(3)], d / name)
    _load_fails(d, name, needle)


@pytest.mark.parametrize(("name", "edit", "needles"), [
    ("hift.pt", "int_weight", ("hift.pt", "wrong dtypes", "int64")),
    ("llm.pt", "nan_weight", ("llm.pt", "NaN or infinite", "llm_decoder.weight")),
    ("flow.pt", "sparse", ("flow.pt", "not a plain dense tensor")),
    ("flow.pt", "int_key", ("flow.pt", "key 7 is not a string")),
    ("llm.pt", "reshaped", ("llm.pt", "speech_embedding.weight (1, ")),
])
def test_bad_tensors_are_named(cv2_dir, tmp_path, name, edit, needles):
    sd = torch.load(cv2_dir / name, map_location="cpu", weights_only=True)
    if edit == "int_weight":
        key = next(k for k in sd if k.endswith(".bias"))  # not a weight-norm pair: reaches the strict check
        sd[key] = sd[key].long()
    elif edit == "nan_weight":
        sd["llm_decoder.weight"] = sd["llm_decoder.weight"].clone()
        sd["llm_decoder.weight"][0, 0] = float("nan")
    elif edit == "sparse":
        key = next(k for k, v in sd.items() if v.dim() == 2)
        sd[key] = sd[key].to_sparse()
    elif edit == "int_key":
        sd[7] = torch.zeros(1)
    else:
        sd["speech_embedding.weight"] = sd["speech_embedding.weight"][:1]
    d = _fixture_copy(cv2_dir, tmp_path / "model", {name: None})
    torch.save(sd, d / name)
    _load_fails(d, *needles)


def test_a_failed_load_leaves_the_module_untouched():
    module = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    bad = {"weight": torch.ones(2, 3), "bias": torch.tensor([0.0, float("inf")])}
    with pytest.raises(CheckpointError, match="bias"):
        load_into(module, bad, "x.pt")
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    load_into(module, {"weight": torch.ones(2, 3), "bias": torch.zeros(2)}, "x.pt")  # a good one loads
    assert torch.equal(module.weight, torch.ones(2, 3))


# -- cosyvoice2.yaml ---------------------------------------------------------------------------------------------------
def _laughs(levels: int = 9, width: int = 10) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _ref_laughs(levels: int = 30) -> str:
    lines = ["r0: [1, 2]"] + [f"r{i}: [!ref <r{i - 1}>, !ref <r{i - 1}>]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("text", "needle"), [
    (_laughs(), "more than 20,000 nodes (YAML aliases)"),
    (_ref_laughs(), "more than 20,000 nodes (!ref)"),
    ("a: &a [1, *a]\n", "recursive"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nest"),
    ("a: !!int abc\n", "cannot read"),
    ("a: [1, 2\n", "cannot read"),
    ("- just\n- a list\n", "not a YAML mapping"),
])
def test_hostile_yaml_fails_fast_and_small(tmp_path, text, needle):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="cosyvoice2.yaml") as err:
        read_hyperpyyaml(path)
    elapsed = time.perf_counter() - start
    assert needle in str(err.value)
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    tracemalloc.start()  # a second run for memory (tracing slows Python down several times)
    try:
        with pytest.raises(CheckpointError):
            read_hyperpyyaml(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_yaml_file_limits(tmp_path, cv2_dir):
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" + "# padding\n" * 120_000)
    with pytest.raises(CheckpointError, match="a config file is at most"):
        read_hyperpyyaml(big)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(CheckpointError, match="not UTF-8"):
        read_hyperpyyaml(latin1)
    # The release's arithmetic refs still resolve; a division by zero in one is reported where it is read.
    text = (cv2_dir / "config.yaml").read_text()
    (tmp_path / "ok.yaml").write_text(text)
    assert read_hyperpyyaml(tmp_path / "ok.yaml")["flow"]["decoder"]["estimator"]["static_chunk_size"] == 50
    (tmp_path / "div.yaml").write_text(text.replace("!ref <chunk_size> * <token_mel_ratio>", "!ref <chunk_size> / 0"))
    with pytest.raises(CheckpointError, match=r"flow\.decoder\.estimator\.static_chunk_size cannot be resolved"):
        CosyVoice2Config.from_files(tmp_path / "div.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")


def _set(y: dict, dotted: str, value) -> dict:
    node = y
    *parents, last = dotted.split(".")
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return y


_DELETE = object()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("flow.output_size", -80, "flow.output_size must be a positive integer, got -80"),
    ("flow.encoder.num_blocks", "two", "flow.encoder.num_blocks must be a positive integer, got 'two'"),
    ("flow.encoder.num_blocks", 2.5, "flow.encoder.num_blocks must be a positive integer, got 2.5"),
    ("flow.encoder.num_blocks", True, "flow.encoder.num_blocks must be a positive integer, got True"),
    ("llm.speech_token_size", _DELETE, "llm.speech_token_size is required"),
    ("flow.decoder.cfm_params.t_scheduler", "quadratic", "flow.decoder.cfm_params.t_scheduler must be one of"),
    ("flow.decoder.cfm_params.solver", "rk4", "flow.decoder.cfm_params.solver must be one of ('euler',)"),
    ("llm.sampling.top_p", 1.5, "llm.sampling.top_p must be a positive number <= 1"),
    ("feat_extractor.center", "no", "feat_extractor.center must be true or false, got 'no'"),
    ("hift.nsf_alpha", float("nan"), "hift.nsf_alpha must be a non-negative number, got nan"),
    ("hift.upsample_rates", [8, -5, 3], "hift.upsample_rates[1] must be a positive integer, got -5"),
    ("hift.resblock_dilation_sizes", [[1, 3, 5], [1, 0, 5], [1, 3, 5]],
     "hift.resblock_dilation_sizes[1][1] must be a positive integer, got 0"),
    ("flow.decoder.estimator.channels", 64, "flow.decoder.estimator.channels must be a non-empty list"),
    ("flow.decoder", [1, 2], "flow.decoder must be a mapping"),
    ("hift", None, "hift must be a mapping, got None"),
    ("llm.mix_ratio", [5], "llm.mix_ratio must be 2 positive integers"),
    ("token_mel_ratio", 3, "token_mel_ratio (3) disagrees with flow.token_mel_ratio (2)"),
    ("flow.decoder.estimator.__tag__", "!new:cosyvoice.flow.decoder.Other", "flow.decoder.estimator: unknown class"),
    ("llm.sampling.__tag__", "!name:cosyvoice.utils.common.nucleus_sampling", "llm.sampling: unknown class"),
    ("flow.output_size", 100_000, "mel bins"),  # would allocate 6 GB of CFM noise before the weights are checked
])
def test_config_values_are_typed_and_named(cv2_dir, key, value, message):
    y = read_hyperpyyaml(cv2_dir / "config.yaml")
    qwen = Qwen2Config.from_json(cv2_dir / "CosyVoice-BlankEN" / "config.json")
    CosyVoice2Config.from_dict(y, qwen, "cosyvoice2.yaml")  # the unchanged file is fine
    with pytest.raises(CheckpointError) as err:
        CosyVoice2Config.from_dict(_set(y, key, value), qwen, "cosyvoice2.yaml")
    assert str(err.value).startswith("cosyvoice2.yaml: ") and message in str(err.value), str(err.value)


def test_a_bad_yaml_value_fails_the_load_naming_file_and_key(cv2_dir, tmp_path):
    text = (cv2_dir / "config.yaml").read_text().replace("    output_size: 80\n", "    output_size: -80\n", 1)
    d = _fixture_copy(cv2_dir, tmp_path / "model", {"config.yaml": text})
    _load_fails(d, "config.yaml: flow.output_size must be a positive integer, got -80")


@pytest.mark.parametrize(("edit", "message"), [
    ({"hidden_size": "64"}, "hidden_size must be a positive integer, got '64'"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"vocab_size": None}, "vocab_size is required"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a positive number"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"head_dim": 7}, "head_dim 7 != hidden_size / num_attention_heads"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
])
def test_qwen_config_values(cv2_dir, tmp_path, edit, message):
    data = json.loads((cv2_dir / "CosyVoice-BlankEN" / "config.json").read_text())
    for k, v in edit.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as err:
        Qwen2Config.from_json(path)
    assert "config.json" in str(err.value) and message in str(err.value), str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "must hold a JSON object, found list"),
    ("{", "is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_unparseable_json_configs(cv2_dir, tmp_path, text, message):
    d = _fixture_copy(cv2_dir, tmp_path / "model", {"CosyVoice-BlankEN/config.json": text})
    _load_fails(d, "config.json", message)


# -- cadenza.json ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("edit", "message"), [
    ({"default_speaker": 5}, "default_speaker must be a non-empty string, got 5"),
    ({"status": "beta"}, "status must be one of ('experimental', 'preview', 'stable'), got 'beta'"),
    ({"voices": "joe"}, "voices must be a list of objects"),
    ({"voices": [{"name": "joe", "heldout": "no"}]}, "voices[0].heldout must be true or false"),
    ({"voices": [{"name": ""}]}, "voices[0].name must be a non-empty string"),
    ({"voices": [{"name": "joe", "train_minutes": -3}]}, "voices[0].train_minutes must be a non-negative number"),
    ({"version": 3}, "version must be one of (1, 2) (written by a newer cadenza?)"),
    ({"version": "2"}, "version must be one of (1, 2)"),
    ({"format": "other"}, "format must be 'cadenza.model'"),
    ({"weights_dtype": "int8"}, "weights_dtype must be one of"),
    ({"speaker_prompts": {"joe": 5}}, "speaker_prompts must be an object of speaker -> transcript strings"),
    ({"status_note": ["x"]}, "status_note must be a string"),
])
def test_cadenza_json_is_typed(edit, message):
    doc = read_model_metadata(builtin_model_dir())
    parse_model_metadata(doc)  # the shipped file is valid
    with pytest.raises(CheckpointError) as err:
        parse_model_metadata({**doc, **edit}, "cadenza.json")
    assert str(err.value).startswith("cadenza.json: ") and message in str(err.value), str(err.value)


def test_a_bad_cadenza_json_fails_the_load(cv2_dir, tmp_path):
    d = _fixture_copy(cv2_dir, tmp_path / "a", {"cadenza.json": json.dumps({"status": 1})})
    _load_fails(d, "cadenza.json", "status must be one of")
    d = _fixture_copy(cv2_dir, tmp_path / "b", {"cadenza.json": "[]"})
    _load_fails(d, "cadenza.json", "must hold a JSON object")
    d = _fixture_copy(cv2_dir, tmp_path / "c", {"cadenza.json": json.dumps({"default_speaker": "joe"})})
    _load_fails(d, "cadenza.json", "default_speaker 'joe' is not a saved speaker")


# -- the frontend models: verified at load, never blamed on the client -------------------------------------------------
@pytest.mark.parametrize("name", ["campplus.onnx", "speech_tokenizer_v2.onnx"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "directory"])
def test_broken_onnx_models_fail_the_load(toy_src, tmp_path, name, damage):
    data = (toy_src / name).read_bytes()
    content = {"truncated": data[: len(data) // 2], "empty": b"", "directory": "<dir>"}[damage]
    d = _copy(toy_src, tmp_path / "model", {name: content})
    err = _load_fails(d, name)
    assert not isinstance(err, InputError)


def _onnx(path: Path, nodes, inputs, outputs, inits=()) -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _campplus(path: Path, dim: int, fixed_frames: int | None = None) -> None:
    from onnx import TensorProto, helper, numpy_helper

    proj = numpy_helper.from_array(np.full((80, dim), 0.01, dtype=np.float32), "proj")
    nodes, inits, src = [], [proj], "input"
    if fixed_frames is not None:  # a model that only works for one input length
        inits.append(numpy_helper.from_array(np.array([1, fixed_frames, 80], dtype=np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["input", "shape"], ["fixed"]))
        src = "fixed"
    nodes += [helper.make_node("ReduceMean", [src], ["pooled"], axes=[1], keepdims=0),
              helper.make_node("MatMul", ["pooled", "proj"], ["embedding"])]
    _onnx(path, nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, None, 80])],
          [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, dim])], inits)


def test_onnx_models_that_do_not_fit_the_model(toy_src, tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    d = _copy(toy_src, tmp_path / "wide", {"campplus.onnx": None})
    _campplus(d / "campplus.onnx", 256)
    _load_fails(d, "campplus.onnx: the speaker encoder gave (1, 256), not a 192-d embedding")

    d = _copy(toy_src, tmp_path / "one_input", {"speech_tokenizer_v2.onnx": None})
    _campplus(d / "speech_tokenizer_v2.onnx", 192)  # a speaker encoder in the tokenizer's place
    _load_fails(d, "speech_tokenizer_v2.onnx", "not a speech tokenizer")

    d = _copy(toy_src, tmp_path / "ids", {"speech_tokenizer_v2.onnx": None})
    offset = numpy_helper.from_array(np.array(5000, dtype=np.int64), "offset")
    _onnx(d / "speech_tokenizer_v2.onnx",
          [helper.make_node("AveragePool", ["feats"], ["pooled"], kernel_shape=[4], strides=[4]),
           helper.make_node("ArgMax", ["pooled"], ["bins"], axis=1, keepdims=0),
           helper.make_node("Add", ["bins", "offset"], ["ids"])],
          [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, None]),
           helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])], [offset])
    _load_fails(d, "speech_tokenizer_v2.onnx: ", "outside the model's speech vocabulary [0, 200)")


def test_a_frontend_model_failing_at_run_time_is_not_the_clients_fault(toy_src, tmp_path):
    d = _copy(toy_src, tmp_path / "model", {"campplus.onnx": None})
    _campplus(d / "campplus.onnx", 192, fixed_frames=100)  # passes the 1 s start-up probe, fails on 2 s
    t = np.arange(32000) / 16000
    wav = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    with Cadenza.from_pretrained(d) as tts:
        with pytest.raises(CheckpointError, match="campplus.onnx failed at run time") as err:
            tts.voice_from_audio((wav, 16000), "Hello there.")
        assert not isinstance(err.value, InputError)
        assert str(d) not in str(err.value)  # the message can reach a client: no absolute path
        # An input error raised inside a model is re-labelled too (the client's audio was checked before it).
        fe = tts.engine.frontend

        def model(_):
            raise AudioError("inner")

        with pytest.raises(CheckpointError, match="the speaker encoder failed: AudioError: inner"):
            fe._run_part("speaker encoder", model, torch.zeros(1))


@pytest.mark.parametrize(("write", "needles"), [
    ({"CosyVoice-BlankEN/merges.txt": None}, ("has vocab.json but not merges.txt",)),
    ({"CosyVoice-BlankEN/vocab.json": "{not json"}, ("cannot build the tokenizer", "CosyVoice-BlankEN")),
    ({"CosyVoice-BlankEN/tokenizer_config.json": "[1]"}, ("text tokenizer", "AttributeError")),
])
def test_broken_tokenizer_files_fail_the_load(toy_src, tmp_path, write, needles):
    _load_fails(_copy(toy_src, tmp_path / "model", write), *needles)


@pytest.mark.parametrize(("table", "needles"), [
    ({"symbols": ["a", 1]}, ("phonemes.json", "non-empty string", "1")),
    ({"symbols": [f"s{i}" for i in range(400)]}, ("phonemes.json", "400 ids", "only 300")),
    ({"symbols": ["a", "b"], "language": "xx-nowhere"}, ("phonemes.json", "fails on 'Hello, world.'")),
])
def test_broken_phoneme_tables_fail_the_load(cv2_dir, tmp_path, table, needles):
    pytest.importorskip("espeakng_loader")
    d = _fixture_copy(cv2_dir, tmp_path / "model", {"CosyVoice-BlankEN/phonemes.json": json.dumps(table)})
    _load_fails(d, *needles)


# -- spk2info.pt -------------------------------------------------------------------------------------------------------
def _prompt(tokens: int = 10) -> SpeakerPrompt:
    ids = (torch.arange(tokens) % 100)[None]
    return SpeakerPrompt(prompt_text=torch.tensor([[1, 2, 3]]), llm_prompt_speech=ids,
                         flow_prompt_speech=ids, prompt_mel=torch.zeros(1, 2 * tokens, 80),
                         embedding=torch.ones(1, 192))


@pytest.mark.parametrize(("edit", "needles"), [
    (lambda e: e.update(flow_embedding=torch.ones(1, 100)), ("embedding has 100 values",)),
    (lambda e: e.update(flow_prompt_speech_token=e["flow_prompt_speech_token"].float()), ("integer ids",)),
    (lambda e: e["prompt_speech_feat"].__setitem__((0, 0, 0), float("nan")), ("prompt_speech_feat", "finite")),
    (lambda e: e.update(llm_prompt_speech_token=torch.tensor([[0, 999]])), ("llm_prompt_speech_token", "[0, 200)")),
    (lambda e: e.update(prompt_text=torch.tensor([[-1]])), ("prompt_text", "[0, 300)")),
    (lambda e: e.update(prompt_speech_feat=torch.zeros(1, 40, 80)), ("40 frames", "10 tokens")),
    (lambda e: e.update(prompt_speech_feat=torch.zeros(1, 20, 64)), ("64 mel bins",)),
    (lambda e: e.update(flow_embedding="x"), ("flow_embedding is a str",)),
    (lambda e: e.pop("flow_prompt_speech_token"), ("no flow_prompt_speech_token",)),
])
def test_saved_speakers_are_verified_at_load(cv2_dir, tmp_path, edit, needles):
    good = _prompt().to_entry()
    d = _fixture_copy(cv2_dir, tmp_path / "ok", {"spk2info.pt": None})
    torch.save({"amy": good}, d / "spk2info.pt")
    with Cadenza.from_pretrained(d) as tts:  # a valid entry loads and is usable
        assert tts.speakers == ["amy"] and tts.engine.speakers.get("amy").embedding.shape == (1, 192)
    bad = _prompt().to_entry()
    edit(bad)
    d = _fixture_copy(cv2_dir, tmp_path / "bad", {"spk2info.pt": None})
    torch.save({"amy": good, "bob": bad}, d / "spk2info.pt")
    _load_fails(d, "spk2info.pt", "speaker 'bob'", *needles)


def test_spk2info_shapes_of_the_container(cv2_dir, tmp_path):
    d = _fixture_copy(cv2_dir, tmp_path / "a", {"spk2info.pt": None})
    torch.save({"amy": torch.zeros(3)}, d / "spk2info.pt")
    _load_fails(d, "spk2info.pt", "speaker 'amy' must be a string id with a dict entry")
    d = _fixture_copy(cv2_dir, tmp_path / "b", {"spk2info.pt": None})
    torch.save({"amy": _prompt(800).to_entry()}, d / "spk2info.pt")
    _load_fails(d, "spk2info.pt", "800 tokens; a prompt has at most 750 (30 s)")
    store = SpeakerStore(None)  # no file: an empty store, nothing to verify
    store.verify(CosyVoice2Config.official())
    assert store.ids() == []


# -- the built-in model's own speaker encoder / speech tokenizer (safetensors + JSON) ----------------------------------
@pytest.mark.parametrize(("write", "needles"), [
    ({"speaker_encoder.safetensors": "trunc"}, ("speaker_encoder.safetensors", "corrupt or truncated")),
    ({"speech_tokenizer.json": None}, ("speech_tokenizer.safetensors but not speech_tokenizer.json",)),
    ({"speaker_encoder.json": "tdnn_kernel"}, ("speaker_encoder.json", "tdnn_kernel must be a positive integer")),
    ({"speech_tokenizer.json": "version"}, ("speech_tokenizer.json", "has version '1'")),
    ({"cosyvoice2.yaml": "sigma"}, ("cosyvoice2.yaml", "flow.decoder.cfm_params.sigma_min must be a non-negative")),
])
def test_builtin_model_copies_with_broken_parts(tmp_path, write, needles):
    src = builtin_model_dir()
    content = {}
    for rel, how in write.items():
        if how == "trunc":
            data = (src / rel).read_bytes()
            content[rel] = data[: len(data) - 1000]
        elif how == "tdnn_kernel":
            doc = json.loads((src / rel).read_text())
            doc["config"]["tdnn_kernel"] = "5"
            content[rel] = json.dumps(doc)
        elif how == "version":
            doc = json.loads((src / rel).read_text())
            doc["version"] = "1"
            content[rel] = json.dumps(doc)
        elif how == "sigma":
            content[rel] = (src / rel).read_text().replace("sigma_min: 1.0e-06", "sigma_min: -1")
        else:
            content[rel] = how
    _load_fails(_copy(src, tmp_path / "model", content), *needles)


def test_component_configs_reject_wrong_types():
    with pytest.raises(InputError, match="rope_theta must be a positive finite number"):
        SpeechTokenizerConfig.from_dict({"rope_theta": "big"})
    with pytest.raises(InputError, match="max_seconds must be a positive finite number"):
        SpeechTokenizerConfig.from_dict({"max_seconds": float("inf")})
    with pytest.raises(InputError, match="conv_strides"):
        SpeechTokenizerConfig.from_dict({"conv_strides": [True, 2]})
    for cls in (SpeechTokenizerConfig, SpeakerEncoderConfig):
        with pytest.raises(InputError, match="must be a mapping"):
            cls.from_dict(["n_mels"])


def test_inspect_directory_checks_optional_files_that_are_present(cv2_dir, tmp_path):
    d = _fixture_copy(cv2_dir, tmp_path / "model", {"campplus.onnx": "<dir>"})
    with pytest.raises(CheckpointError, match="campplus.onnx: .* is a directory"):
        inspect_directory(d)
    d = _fixture_copy(cv2_dir, tmp_path / "model2", {"spk2info.pt": b""})
    with pytest.raises(CheckpointError, match=r"spk2info.pt: .* is empty"):
        inspect_directory(d)


def test_without_onnxruntime_the_onnx_parts_are_skipped_with_a_warning(toy_src, monkeypatch, caplog):
    from cadenza.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with caplog.at_level("WARNING"), Cadenza.from_pretrained(toy_src) as tts:
        assert "needs onnxruntime" in caplog.text and "prompt audio cannot be used" in caplog.text
        assert tts.synthesize(text_ids=[1, 2, 3], seed=0).duration > 0  # the rest of the model works
        t = np.arange(16000) / 16000
        with pytest.raises(MissingDependencyError, match="cadenza\\[onnx\\]"):
            tts.voice_from_audio(((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000), "Hello.")
