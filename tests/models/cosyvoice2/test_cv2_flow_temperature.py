"""The flow's inference temperature and Euler steps (``cfm_params.inference_temperature`` / ``n_timesteps``, Cadenza
keys): read and validated from the yaml, written back only when set, and applied on every path that draws the fixed
noise / integrates the flow."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cadenza.builtin import builtin_model_dir
from cadenza.errors import CheckpointError
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.training.model_files import write_model_config
from helpers import one_torch_thread

from small_model import small_model, voice

BUILTIN = builtin_model_dir()


def _config_with(tmp_path, line: str | None) -> CosyVoice2Config:
    lines = (BUILTIN / "cosyvoice2.yaml").read_text().splitlines(keepends=True)
    text = "".join(x for x in lines if "inference_temperature" not in x and "n_timesteps" not in x)  # as released
    if line is not None:
        anchor = "      inference_cfg_rate:"
        assert anchor in text
        text = text.replace(anchor, f"      {line}\n{anchor}", 1)
    (tmp_path / "cosyvoice2.yaml").write_text(text)
    return CosyVoice2Config.from_files(tmp_path / "cosyvoice2.yaml", BUILTIN / "CosyVoice-BlankEN" / "config.json")


def test_read_validated_and_written_back_only_when_set(tmp_path):
    assert _config_with(tmp_path, None).flow.cfm.inference_temperature == 1.0  # the release's yaml has no such key
    cfg = _config_with(tmp_path, "inference_temperature: 0.5")
    assert cfg.flow.cfm.inference_temperature == 0.5
    for bad in ("3.0", "-0.1", "warm"):
        with pytest.raises(CheckpointError, match="inference_temperature"):
            _config_with(tmp_path, f"inference_temperature: {bad}")
    write_model_config(tmp_path / "out", cfg)
    assert "inference_temperature: 0.5" in (tmp_path / "out" / "cosyvoice2.yaml").read_text()
    again = CosyVoice2Config.from_files(tmp_path / "out" / "cosyvoice2.yaml",
                                        tmp_path / "out" / "CosyVoice-BlankEN" / "config.json")
    assert again.flow.cfm.inference_temperature == 0.5
    write_model_config(tmp_path / "plain", _config_with(tmp_path, None))
    assert "inference_temperature" not in (tmp_path / "plain" / "cosyvoice2.yaml").read_text()



def test_euler_steps_are_read_validated_written_back_and_used_whole_and_streamed(tmp_path):
    assert _config_with(tmp_path, None).flow.cfm.n_timesteps == 10  # the release's code: 10
    cfg = _config_with(tmp_path, "n_timesteps: 7")
    assert cfg.flow.cfm.n_timesteps == 7
    for bad in ("0", "-3", "7.5", "many"):
        with pytest.raises(CheckpointError, match="n_timesteps"):
            _config_with(tmp_path, f"n_timesteps: {bad}")
    write_model_config(tmp_path / "out", cfg)
    assert "n_timesteps: 7" in (tmp_path / "out" / "cosyvoice2.yaml").read_text()
    write_model_config(tmp_path / "plain", _config_with(tmp_path, None))
    assert "n_timesteps" not in (tmp_path / "plain" / "cosyvoice2.yaml").read_text()
    # Fewer steps change the mel, and the streamed (cached) flow keeps one cache per step: a stream still equals
    # recomputing the prefix.
    _changed_and_streamed_as_whole(small_model(), n_timesteps=4)


def _changed_and_streamed_as_whole(model, **cfm_changes) -> TokenToMelFlow:
    """``model``'s flow with ``cfm_changes``: its output differs from the flow's own, and the streamed path (cached,
    chunk by chunk) gives what recomputing the prefix gives (as tests/models/cosyvoice2/test_cv2_flow_incremental.py
    checks with the release's settings)."""
    cfg = dataclasses.replace(model.config.flow, cfm=dataclasses.replace(model.config.flow.cfm, **cfm_changes))
    flow = TokenToMelFlow(cfg).eval()
    flow.load_state_dict(model.flow.state_dict())
    v = voice(model, 6, seed=3)
    tokens = torch.randint(0, cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    args = (v.flow_prompt_speech, v.prompt_mel, v.embedding)
    la, ratio = cfg.pre_lookahead_len, cfg.token_mel_ratio
    with one_torch_thread(), torch.inference_mode():
        whole = flow.inference(tokens, *args, streaming=True, finalize=True)
        assert (whole - model.flow.inference(tokens, *args, streaming=True, finalize=True)).abs().mean() > 1e-3
        with IncrementalFlow(flow, *args) as session:
            first = session.push(tokens[:, :20], tokens[:, 20:20 + la], final=False)
            rest = session.push(tokens[:, 20:], None, final=True)
        assert torch.allclose(first, flow.inference(tokens[:, :20 + la], *args, streaming=True, finalize=False),
                              atol=1e-4)
        assert torch.allclose(rest, whole[:, :, ratio * 20:], atol=1e-4)
    return flow


def test_scales_the_noise_of_whole_and_streamed_inference_alike():
    model = small_model()
    cold = _changed_and_streamed_as_whole(model, inference_temperature=0.5)
    assert torch.equal(cold.decoder.rand_noise, 0.5 * model.flow.decoder.rand_noise)
