"""Hostile and broken weight files of a model folder: code in a pickle never runs, and every damaged or mismatched
weight file fails the load with a ``CheckpointError`` naming the file (and the key or shape), leaving the module
untouched. Broken copies: tests/cv2_broken_copies.py."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cadenza import CheckpointError
from cadenza.loading import load_into
from cv2_broken_copies import WEIGHTS, fixture_copy, load_fails


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

    d = fixture_copy(cv2_dir, tmp_path / "model", {name: evil.read_bytes()})
    err = load_fails(d, name)
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
    d = fixture_copy(cv2_dir, tmp_path / "model", {name: content})
    if damage == "dangling_link":
        os.symlink(tmp_path / "nowhere.pt", d / name)
    if damage == "not_a_state_dict":
        torch.save([torch.zeros(3)], d / name)
    load_fails(d, name, needle)


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
    d = fixture_copy(cv2_dir, tmp_path / "model", {name: None})
    torch.save(sd, d / name)
    load_fails(d, *needles)


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


