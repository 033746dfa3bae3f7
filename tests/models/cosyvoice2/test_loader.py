"""Loading a model directory: what is required, strict keys, safe unpickling, config tags, bad files."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from cadenza import Cadenza, CheckpointError
from cadenza.loading import read_torch_state_dict
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
from cadenza.models.cosyvoice2.yaml_reader import read_hyperpyyaml

FILES = ("config.yaml", "llm.pt", "flow.pt", "hift.pt")


def _linked_dir(cv2_dir, tmp_path, skip=()):
    d = tmp_path / "model"
    (d / "CosyVoice-BlankEN").mkdir(parents=True)
    for name in FILES:
        if name not in skip:
            os.symlink(cv2_dir / name, d / name)
    os.symlink(cv2_dir / "CosyVoice-BlankEN" / "config.json", d / "CosyVoice-BlankEN" / "config.json")
    return d


def test_error_lists_every_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        inspect_directory(tmp_path / "nope")
    with pytest.raises(CheckpointError) as err:
        Cadenza.from_pretrained(tmp_path)
    for name in ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/config.json"):
        assert name in str(err.value)


def test_loads_and_matches_the_checkpoint(cv2_dir, tmp_path):
    files = inspect_directory(_linked_dir(cv2_dir, tmp_path))
    model = load_cosyvoice2_weights(files)
    flow_sd = torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True)
    for key, value in flow_sd.items():
        assert torch.equal(model.flow.state_dict()[key], value), key
    assert files.tokenizer_dir is None and files.campplus is None and files.spk2info is None


def test_strict_keys_name_the_offenders(cv2_dir, tmp_path):
    d = _linked_dir(cv2_dir, tmp_path, skip=("flow.pt",))
    sd = torch.load(cv2_dir / "flow.pt", map_location="cpu", weights_only=True)
    sd.pop("encoder_proj.bias")
    sd["encoder.surprise.weight"] = torch.zeros(3)
    sd["spk_embed_affine_layer.weight"] = torch.zeros(7, 7)
    torch.save(sd, d / "flow.pt")
    with pytest.raises(CheckpointError) as err:
        load_cosyvoice2_weights(inspect_directory(d))
    msg = str(err.value)
    assert "flow.pt" in msg and "encoder_proj.bias" in msg and "encoder.surprise.weight" in msg
    assert "spk_embed_affine_layer.weight (7, 7)" in msg


def test_training_checkpoint_extras_are_ignored(cv2_dir, tmp_path):
    d = _linked_dir(cv2_dir, tmp_path, skip=("llm.pt",))
    sd = torch.load(cv2_dir / "llm.pt", map_location="cpu", weights_only=True)
    sd.update(epoch=3, step=1200)
    torch.save(sd, d / "llm.pt")
    load_cosyvoice2_weights(inspect_directory(d))


def test_corrupt_and_malicious_weight_files(cv2_dir, tmp_path):
    d = _linked_dir(cv2_dir, tmp_path, skip=("llm.pt", "hift.pt"))
    (d / "llm.pt").write_bytes(b"\x00garbage" * 100)
    shutil.copy(cv2_dir / "hift.pt", d / "hift.pt")
    with pytest.raises(CheckpointError, match="llm.pt"):
        load_cosyvoice2_weights(inspect_directory(d))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    torch.save({"x": Evil()}, d / "llm.pt")
    with pytest.raises(CheckpointError, match="llm.pt"):
        read_torch_state_dict(d / "llm.pt")
    assert not (tmp_path / "pwned").exists()


def test_both_weight_norm_namings_load_identically(cv2_dir, tmp_path):
    plain = load_cosyvoice2_weights(inspect_directory(_linked_dir(cv2_dir, tmp_path / "a")))
    d = _linked_dir(cv2_dir, tmp_path / "b", skip=("hift.pt",))
    os.symlink(cv2_dir / "hift_legacy_weightnorm_names.pt", d / "hift.pt")
    legacy = load_cosyvoice2_weights(inspect_directory(d))
    for (k1, v1), (k2, v2) in zip(plain.hift.state_dict().items(), legacy.hift.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1


def test_yaml_tags_are_data_never_code(cv2_dir, tmp_path):
    text = (cv2_dir / "config.yaml").read_text()
    marker = tmp_path / "imported"
    evil = text + f"\n__evil: !apply:os.system ['touch {marker}']\n__evil2: !new:os.system\n    command: 'touch {marker}'\n"
    (tmp_path / "cosyvoice2.yaml").write_text(evil)
    y = read_hyperpyyaml(tmp_path / "cosyvoice2.yaml")
    assert not marker.exists() and "__evil" not in y and y["__evil2"]["__tag__"] == "!new:os.system"


@pytest.mark.parametrize(("old", "new", "ok"), [
    ("CausalConditionalDecoder", "ConditionalDecoder", True),  # old ModelScope revisions
    ("CausalConditionalDecoder", "SomethingElse", False),
])
def test_decoder_class_names(cv2_dir, tmp_path, old, new, ok):
    (tmp_path / "cosyvoice2.yaml").write_text((cv2_dir / "config.yaml").read_text().replace(old, new))
    qwen = cv2_dir / "CosyVoice-BlankEN" / "config.json"
    if ok:
        cfg = CosyVoice2Config.from_files(tmp_path / "cosyvoice2.yaml", qwen)
        assert cfg.flow.estimator.static_chunk_size == cfg.chunk_size * cfg.token_mel_ratio
    else:
        with pytest.raises(CheckpointError, match="SomethingElse"):
            CosyVoice2Config.from_files(tmp_path / "cosyvoice2.yaml", qwen)


def test_invalid_config_values_are_rejected(cv2_dir, tmp_path):
    text = (cv2_dir / "config.yaml").read_text().replace("in_channels: 320", "in_channels: 321")
    (tmp_path / "cosyvoice2.yaml").write_text(text)
    with pytest.raises(CheckpointError, match="in_channels"):
        CosyVoice2Config.from_files(tmp_path / "cosyvoice2.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json")


def test_lm_length_limits_from_yaml():
    """``llm.min/max_token_text_ratio`` are optional yaml keys (the release's code fixes 2 and 20): absent -> 2 / 20,
    present -> used by decoding, written back on export, and validated."""
    from cadenza.errors import CheckpointError as _CheckpointError
    from cadenza.models.cosyvoice2.config import CosyVoice2Config, Qwen2Config
    from cadenza.training.model_files import cosyvoice2_yaml

    y = cosyvoice2_yaml(CosyVoice2Config.official())
    del y["llm"]["min_token_text_ratio"], y["llm"]["max_token_text_ratio"]
    cfg = CosyVoice2Config.from_dict(y, Qwen2Config(), "test")
    assert (cfg.lm.min_token_text_ratio, cfg.lm.max_token_text_ratio) == (2.0, 20.0)
    y["llm"]["max_token_text_ratio"] = 9
    cfg = CosyVoice2Config.from_dict(y, Qwen2Config(), "test")
    assert cfg.lm.max_token_text_ratio == 9.0 and cosyvoice2_yaml(cfg)["llm"]["max_token_text_ratio"] == 9.0
    y["llm"]["min_token_text_ratio"] = 10
    with pytest.raises((_CheckpointError, ValueError), match="token_text_ratio"):
        CosyVoice2Config.from_dict(y, Qwen2Config(), "test")
