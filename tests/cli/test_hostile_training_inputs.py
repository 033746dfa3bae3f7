"""The hostile-input sweep of ``cadenza train`` (issue #19): training configs, stage names, checkpoints (never
unpickled, named when damaged) and resume. Each hostile input gives exit code 2 and one ``error: ...`` line, and
nothing half-written (docs/hostile_input.md).
"""

from __future__ import annotations

import os
import pickle
import random
import re
from pathlib import Path

import pytest
import torch
import yaml

from cadenza.errors import CheckpointError, InputError
from hostile_entry_points import REPO, one_error_line


# --------------------------------------------------------------------------------------------------------------
# training: configs, stage names, checkpoints, resume
# --------------------------------------------------------------------------------------------------------------
def _lm_config() -> dict:
    config = yaml.safe_load((REPO / "configs" / "train" / "lm_tiny.yaml").read_text())
    config["train"].update(max_steps=2, ckpt_every=1, log_every=1)
    return config


def _write_config(tmp_path: Path, config: dict | str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def _set(config: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return config


@pytest.mark.parametrize("key, value, message", [
    ("train", [1, 2], "training config [train]: expected a mapping, got list"),
    ("train.batch_size", "4", "training config [train]: batch_size must be an integer, got '4' (str)"),
    ("train.batch_size", 4.5, "batch_size must be an integer, got 4.5 (float)"),
    ("train.batch_size", True, "batch_size must be an integer, got True (bool)"),
    ("train.batch_size", -1, "training config [train]: batch_size must be >= 1, got -1"),
    ("train.max_steps", 0, "max_steps must be >= 1, got 0"),
    ("train.seed", -1, "seed must be >= 0, got -1"),
    ("train.seed", 2**70, "seed must be at most 2**32-1"),
    ("train.progress", "no", "progress must be true or false, got 'no' (str)"),
    ("train.bach_size", 4, "unknown keys ['bach_size']"),
    ("train.optim", [1], "training config [train.optim]: expected a mapping, got list"),
    ("train.optim.lr", "fast", "lr must be a number, got 'fast' (str)"),
    ("train.optim.lr", "3e-3", "(YAML reads numbers such as 1e-4 as text: write 1.0e-4)"),
    ("train.optim.lr", float("inf"), "lr must be a finite number, got inf"),
    ("train.optim.lr", float("nan"), "lr must be a finite number, got nan"),
    ("train.optim.lr", -1.0, "lr must be > 0, got -1.0"),
    ("train.optim.betas", 0.9, "betas must be a list of 2 numbers, got 0.9 (float)"),
    ("train.optim.betas", [0.9, "x"], "betas must be a list of 2 numbers"),
    ("train.optim.grad_clip", "x", "grad_clip must be a number, got 'x' (str)"),
    ("lm", "x", "training config [lm]: expected a mapping, got str"),
    ("lm.mix_probability", "x", "training config [lm]: mix_probability must be a number, got 'x' (str)"),
    ("lm.foo", 1, "training config [lm]: unknown keys ['foo']"),
    ("model", "x", "training config [model]: expected a mapping, got str"),
    ("model.qwen.hidden_size", -4, "Qwen2Config.hidden_size must be a positive integer, got -4"),
    ("lm_", {"mix_probability": 0.1}, "training config: unknown section 'lm_'"),
])
def test_training_config_wrong_values(cli, tmp_path, key, value, message):
    config = _write_config(tmp_path, _set(_lm_config(), key, value))
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path, "--out", tmp_path / "out")
    assert code == 2 and message in one_error_line(err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, message", [
    ("train: [1, 2", "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 1, column 13"),
    ("- 1\n- 2\n", "must be a mapping at the top level, not list"),
    ("train: !!python/object/apply:os.system ['touch PWNED']\n", "could not determine a constructor for the tag"),
    ("[" * 100_000, "is nested too deeply to be a config"),
    ("_x: &a [*a]\n", "an alias refers to a node that contains it (a recursive structure)"),
    ("# " + "x" * (1 << 20), "bytes; a config is at most 1048576"),
    (b"train: \xff\n", "is not UTF-8 text (byte 7: invalid start byte)"),
])
def test_training_config_hostile_files(tmp_path, monkeypatch, content, message):
    from cadenza.training.config import load_config_file

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError) as info:
        load_config_file(path)
    assert str(path) in str(info.value) and message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "PWNED").exists()
    deep_json = tmp_path / "c.json"
    deep_json.write_text("[" * 100_000)
    with pytest.raises(InputError, match="is nested too deeply to be a config"):
        load_config_file(deep_json)


def test_training_argument_and_data_errors_create_nothing(cli, tmp_path):
    config = _write_config(tmp_path, _lm_config())
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path, "--out", tmp_path / "out",
                       "--max-steps", "0")
    assert code == 2 and "argument --max-steps: expected a positive integer, got 0" in err
    code, _, err = cli("train", "lm", "--config", config, "--data", tmp_path / "nodata", "--out", tmp_path / "out")
    assert code == 2 and f"error: {tmp_path / 'nodata'} is not a prepared corpus (no index.jsonl)" in err
    assert not (tmp_path / "out").exists()


def test_training_stage_names(tmp_path):
    from cadenza.training.launcher import train
    from cadenza.training.registry import get_stage

    for name in ("", "../../etc", "x" * 10_000, "Lm", 5):
        with pytest.raises(InputError, match="is not a stage name; known: lm, dpo, flow, tokenizer"):
            get_stage(name)
    with pytest.raises(InputError, match="training stage 'no_such' is not available"):
        train("no_such", _write_config(tmp_path, _lm_config()), tmp_path, tmp_path / "out")


def _lm_data(root: Path) -> Path:
    from cadenza.data.shards import write_prepared

    rng = random.Random(0)
    records = []
    for i in range(8):
        text = [rng.randrange(1, 100) for _ in range(6)]
        speech = [(t * k) % 50 for t in text for k in (1, 3, 7, 11)]
        records.append(({"id": f"u{i}", "text": "x"}, {"text_ids": torch.tensor(text, dtype=torch.int32),
                                                       "speech_tokens": torch.tensor(speech, dtype=torch.int32)}))
    write_prepared(root, records, shard_size=4)
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A two-step lm run with a checkpoint per step (seconds on one core)."""
    from cadenza.training.launcher import train

    root = tmp_path_factory.mktemp("train")
    data = _lm_data(root / "data")
    config = _write_config(root, _lm_config())
    torch.set_num_threads(1)
    train("lm", config, data, root / "run")
    return {"data": data, "config": config, "run": root / "run"}


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_checkpoints_are_named_and_never_run(trained, tmp_path):
    from cadenza.training.checkpoint import load_checkpoint

    good = (trained["run"] / "checkpoints" / "step_2.pt").read_bytes()
    marker = tmp_path / "PWNED"
    evil = _Evil()
    evil.marker = marker
    cases = {
        "truncated": (good[: len(good) // 2], "is truncated or corrupt (not a complete torch archive)"),
        "empty": (b"", "is empty (an interrupted copy?)"),
        "garbage": (b"\x00" * 1000, "is truncated or corrupt"),
        "raw_pickle": (pickle.dumps(evil), "holds more than tensors and plain data"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path)
        assert str(path) in str(info.value) and message in str(info.value), (name, str(info.value))
        assert "weights_only=False" not in str(info.value) and len(str(info.value)) < 400
    for name, obj, message in (("evil_torch", {"format": 1, "x": evil}, "refers to the Python object posix.system"),
                               ("a_list", [1, 2, 3], "is not a cadenza training checkpoint (format 1)"),
                               ("step_str", {"format": 1, "state": {}, "step": "abc"}, "'step' must be an integer"),
                               ("step_neg", {"format": 1, "state": {}, "step": -5}, "got '-5'")):
        path = tmp_path / f"{name}.pt"
        torch.save(obj, path)
        with pytest.raises(CheckpointError, match=re.escape(message)):
            load_checkpoint(path)
    assert not marker.exists()  # the pickles' code never ran


def test_resume_from_hostile_checkpoints(cli, trained, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained["run"], run)
    latest = run / "checkpoints" / "step_2.pt"
    good = latest.read_bytes()
    ckpt = torch.load(latest, weights_only=True)
    argv = ("train", "lm", "--config", trained["config"], "--data", trained["data"], "--out", run, "--resume",
            "--max-steps", "3")
    marker = tmp_path / "PWNED"
    evil = _Evil()
    evil.marker = marker
    wrong_shape = {**ckpt, "state": {**ckpt["state"], "model": {k: torch.zeros(3) for k in ckpt["state"]["model"]}}}
    for payload, message in (
        (good[:100], f"error: training checkpoint {latest} is truncated or corrupt"),
        ({**ckpt, "x": evil}, f"error: refused to load training checkpoint {latest}"),
        (wrong_shape, f"error: {latest} does not fit this lm model (written with another config, or damaged): "
                      "RuntimeError: Error(s) in loading state_dict"),
        ({**ckpt, "state": "x"}, "its 'state' is a str, not a mapping (delete it to resume from the one before)"),
        ({**ckpt, "rng": [{"torch": "x"}]}, "unreadable RNG state of rank 0"),
        ({**ckpt, "stage": "flow"}, "is a checkpoint of stage 'flow', not 'lm'"),
    ):
        if isinstance(payload, bytes):
            latest.write_bytes(payload)
        else:
            torch.save(payload, latest)
        code, _, err = cli(*argv)
        assert code == 2 and message in one_error_line(err), err
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1.pt", "step_2.pt"]
    assert not marker.exists()
    code, _, err = cli("train", "lm", "--config", trained["config"], "--data", trained["data"], "--out",
                       trained["config"])
    assert code == 2 and f"error: --out {trained['config']} is a file, not a folder" in err


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    from cadenza.training import checkpoint

    def half_then_interrupt(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, 7, {"stage": "lm", "state": {}})
    assert list((tmp_path / "checkpoints").iterdir()) == []


