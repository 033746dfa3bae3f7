"""Hostile and broken configuration files of a model folder (``cosyvoice2.yaml``, the Qwen2 ``config.json``,
``cadenza.json``): YAML aliases cannot blow up, files are bounded, and every bad value fails the load naming the
file and key. Broken copies: tests/cv2_broken_copies.py."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from cadenza import CheckpointError
from cadenza.builtin import builtin_model_dir, parse_model_metadata, read_model_metadata
from cadenza.models.cosyvoice2.config import CosyVoice2Config, Qwen2Config
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml
from cv2_broken_copies import fixture_copy, load_fails


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
    d = fixture_copy(cv2_dir, tmp_path / "model", {"config.yaml": text})
    load_fails(d, "config.yaml: flow.output_size must be a positive integer, got -80")


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
    d = fixture_copy(cv2_dir, tmp_path / "model", {"CosyVoice-BlankEN/config.json": text})
    load_fails(d, "config.json", message)


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
    ({"speed_method": "fast"}, "speed_method must be one of ('auto', 'phase_vocoder', 'wsola', 'mel', 'flow'), got 'fast'"),
    ({"speaker_prompts": {"joe": 5}}, "speaker_prompts must be an object of speaker -> transcript strings"),
    ({"status_note": ["x"]}, "status_note must be a string"),
    ({"lm_prompt": "no"}, "lm_prompt must be true or false, got 'no'"),
])
def test_cadenza_json_is_typed(edit, message):
    doc = read_model_metadata(builtin_model_dir())
    parse_model_metadata(doc)  # the shipped file is valid
    with pytest.raises(CheckpointError) as err:
        parse_model_metadata({**doc, **edit}, "cadenza.json")
    assert str(err.value).startswith("cadenza.json: ") and message in str(err.value), str(err.value)


def test_a_bad_cadenza_json_fails_the_load(cv2_dir, tmp_path):
    d = fixture_copy(cv2_dir, tmp_path / "a", {"cadenza.json": json.dumps({"status": 1})})
    load_fails(d, "cadenza.json", "status must be one of")
    d = fixture_copy(cv2_dir, tmp_path / "b", {"cadenza.json": "[]"})
    load_fails(d, "cadenza.json", "must hold a JSON object")
    d = fixture_copy(cv2_dir, tmp_path / "c", {"cadenza.json": json.dumps({"default_speaker": "joe"})})
    load_fails(d, "cadenza.json", "default_speaker 'joe' is not a saved speaker")




def test_cadenza_json_names_the_speed_method_and_an_argument_wins(cv2_dir, tmp_path):
    from cadenza import Cadenza

    d = fixture_copy(cv2_dir, tmp_path / "m", {"cadenza.json": json.dumps({"speed_method": "flow"})})
    with Cadenza.from_pretrained(d) as tts:
        assert tts.engine.schedule.speed_method == "flow"
    with Cadenza.from_pretrained(d, speed_method="mel") as tts:
        assert tts.engine.schedule.speed_method == "mel"
    with Cadenza.from_pretrained(cv2_dir) as tts:  # no cadenza.json: the audio time-scale
        assert tts.engine.schedule.speed_method == "auto"
