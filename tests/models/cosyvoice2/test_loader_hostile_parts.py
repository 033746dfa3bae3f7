"""Hostile and broken parts of a model folder beside the weights: the frontend ONNX models (verified at load; a
failure at run time is never the client's fault), tokenizer and phoneme tables, ``spk2info.pt``, and the built-in
model's own speaker encoder / speech tokenizer. Broken copies: tests/cv2_broken_copies.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cadenza import AudioError, Cadenza, CheckpointError, InputError
from cadenza.builtin import builtin_model_dir
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.loader import inspect_directory
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore
from cadenza.models.speaker_encoder import SpeakerEncoderConfig
from cadenza.models.speech_tokenizer import SpeechTokenizerConfig
from cv2_broken_copies import copy_model, fixture_copy, load_fails

from toy_model import build_toy_model_dir


@pytest.fixture(scope="module")
def toy_src(cv2_dir, tmp_path_factory) -> Path:
    """The fixture + a BPE tokenizer + toy campplus.onnx / speech_tokenizer_v2.onnx (see toy_model.py)."""
    return build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")


# -- the frontend models: verified at load, never blamed on the client -------------------------------------------------
@pytest.mark.parametrize("name", ["campplus.onnx", "speech_tokenizer_v2.onnx"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "directory"])
def test_broken_onnx_models_fail_the_load(toy_src, tmp_path, name, damage):
    data = (toy_src / name).read_bytes()
    content = {"truncated": data[: len(data) // 2], "empty": b"", "directory": "<dir>"}[damage]
    d = copy_model(toy_src, tmp_path / "model", {name: content})
    err = load_fails(d, name)
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

    d = copy_model(toy_src, tmp_path / "wide", {"campplus.onnx": None})
    _campplus(d / "campplus.onnx", 256)
    load_fails(d, "campplus.onnx: the speaker encoder gave (1, 256), not a 192-d embedding")

    d = copy_model(toy_src, tmp_path / "one_input", {"speech_tokenizer_v2.onnx": None})
    _campplus(d / "speech_tokenizer_v2.onnx", 192)  # a speaker encoder in the tokenizer's place
    load_fails(d, "speech_tokenizer_v2.onnx", "not a speech tokenizer")

    d = copy_model(toy_src, tmp_path / "ids", {"speech_tokenizer_v2.onnx": None})
    offset = numpy_helper.from_array(np.array(5000, dtype=np.int64), "offset")
    _onnx(d / "speech_tokenizer_v2.onnx",
          [helper.make_node("AveragePool", ["feats"], ["pooled"], kernel_shape=[4], strides=[4]),
           helper.make_node("ArgMax", ["pooled"], ["bins"], axis=1, keepdims=0),
           helper.make_node("Add", ["bins", "offset"], ["ids"])],
          [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, None]),
           helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])], [offset])
    load_fails(d, "speech_tokenizer_v2.onnx: ", "outside the model's speech vocabulary [0, 200)")


def test_a_frontend_model_failing_at_run_time_is_not_the_clients_fault(toy_src, tmp_path):
    d = copy_model(toy_src, tmp_path / "model", {"campplus.onnx": None})
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
    load_fails(copy_model(toy_src, tmp_path / "model", write), *needles)


@pytest.mark.parametrize(("table", "needles"), [
    ({"symbols": ["a", 1]}, ("phonemes.json", "non-empty string", "1")),
    ({"symbols": [f"s{i}" for i in range(400)]}, ("phonemes.json", "400 ids", "only 300")),
    ({"symbols": ["a", "b"], "language": "xx-nowhere"}, ("phonemes.json", "fails on 'Hello, world.'")),
    ({"symbols": ["a", "b"], "lexicon": [{"word": "ab"}]}, ("phonemes.json", "lexicon entry 0", "exactly one")),
    ({"symbols": ["a", "b"], "lexicon": [{"word": "ab", "phonemes": "abc"}]}, ("phonemes.json", "'ab'", "'c'")),
])
def test_broken_phoneme_tables_fail_the_load(cv2_dir, tmp_path, table, needles):
    pytest.importorskip("espeakng_loader")
    d = fixture_copy(cv2_dir, tmp_path / "model", {"CosyVoice-BlankEN/phonemes.json": json.dumps(table)})
    load_fails(d, *needles)


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
    d = fixture_copy(cv2_dir, tmp_path / "ok", {"spk2info.pt": None})
    torch.save({"amy": good}, d / "spk2info.pt")
    with Cadenza.from_pretrained(d) as tts:  # a valid entry loads and is usable
        assert tts.speakers == ["amy"] and tts.engine.speakers.get("amy").embedding.shape == (1, 192)
    bad = _prompt().to_entry()
    edit(bad)
    d = fixture_copy(cv2_dir, tmp_path / "bad", {"spk2info.pt": None})
    torch.save({"amy": good, "bob": bad}, d / "spk2info.pt")
    load_fails(d, "spk2info.pt", "speaker 'bob'", *needles)


def test_spk2info_shapes_of_the_container(cv2_dir, tmp_path):
    d = fixture_copy(cv2_dir, tmp_path / "a", {"spk2info.pt": None})
    torch.save({"amy": torch.zeros(3)}, d / "spk2info.pt")
    load_fails(d, "spk2info.pt", "speaker 'amy' must be a string id with a dict entry")
    d = fixture_copy(cv2_dir, tmp_path / "b", {"spk2info.pt": None})
    torch.save({"amy": _prompt(800).to_entry()}, d / "spk2info.pt")
    load_fails(d, "spk2info.pt", "800 tokens; a prompt has at most 750 (30 s)")
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
    load_fails(copy_model(src, tmp_path / "model", content), *needles)


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
    d = fixture_copy(cv2_dir, tmp_path / "model", {"campplus.onnx": "<dir>"})
    with pytest.raises(CheckpointError, match="campplus.onnx: .* is a directory"):
        inspect_directory(d)
    d = fixture_copy(cv2_dir, tmp_path / "model2", {"spk2info.pt": b""})
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
