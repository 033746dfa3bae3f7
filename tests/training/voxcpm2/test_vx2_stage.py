"""Stage ``voxcpm2`` on the fixture's tiny model: the reference's losses through ``train_step``, LoRA-only steps,
data checks and the latent cache, held-out losses, resume, two gloo processes = one process with the doubled batch
(and micro-batches), full-mode export, config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml
from safetensors.torch import load_file

from cadenza.errors import InputError
from cadenza.models.voxcpm2.audio_vae_loader import load_audio_vae
from cadenza.models.voxcpm2.loader import load_model
from cadenza.training.checkpoint import load_checkpoint
from cadenza.training.launcher import train
from cadenza.training.metrics import read_metrics
from cadenza.training.voxcpm2 import TrainingNoise, VoxCPM2Packer
from cadenza.training.voxcpm2.stage import MicroBatch, VoxCPM2Stage
from helpers import REPO_ROOT, assert_close

LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def fx(vx2_dir: Path) -> Path:
    """The shared fixture folder (tests/conftest.py), which must have ``training.safetensors`` too."""
    if not (vx2_dir / "training.safetensors").is_file():
        pytest.skip(f"VoxCPM 2 training fixtures not found at {vx2_dir} (set CADENZA_FIXTURES_VOXCPM2)")
    return vx2_dir


def write_manifest(folder: Path, fx: Path, extra: list[dict] | None = None) -> Path:
    """Six usable lines over the fixture's two clips (one with a reference clip), plus ``extra``."""
    folder.mkdir(parents=True, exist_ok=True)
    wavs = fx / "wavs"
    lines = [
        {"audio": str(wavs / "prompt_16k.wav"), "text": "Hello the world."},
        {"audio": str(wavs / "ref_16k.wav"), "text": "This is a test, hello."},
        {"audio": str(wavs / "prompt_16k.wav"), "text": "The world is here.", "ref_audio": str(wavs / "ref_16k.wav")},
        {"audio": str(wavs / "ref_16k.wav"), "text": "Hello, this is it."},
        {"audio": str(wavs / "prompt_16k.wav"), "text": "A calm voice."},
        {"audio": str(wavs / "ref_16k.wav"), "text": "The test is over.", "dataset_id": 1},
    ] + (extra or [])
    (folder / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return folder


def config(fx: Path, steps: int = 4, batch: int = 2, **vx2) -> dict:
    return {"train": {"batch_size": batch, "max_steps": steps, "log_every": 1, "ckpt_every": steps,
                      "progress": False, "tensorboard": False, "mixed_precision": "no",
                      "optim": {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01, "schedule": "cosine",
                                "warmup_steps": 1, "grad_clip": 1.0}},
            "voxcpm2": {"init": str(fx / "tiny_model"), **vx2}}


def run(cfg: dict, data: Path, out: Path, **kwargs) -> list[dict]:
    torch.set_num_threads(1)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    train("voxcpm2", path, data, out, **kwargs)
    return read_metrics(out)


@pytest.fixture(scope="module")
def reference(fx):
    t = load_file(str(fx / "training.safetensors"))
    manifest = json.loads((fx / "manifest.json").read_text())
    tiny = fx / "tiny_model"
    model_config = load_model(tiny).config
    packer = VoxCPM2Packer(load_audio_vae(tiny), model_config.patch_size, model_config.feat_dim,
                           special=model_config.special_tokens)
    n = t["in_audio_tokens"].shape[0]
    batch = packer(packer.from_padded(t["in_audio_tokens"], t["in_text_tokens"], torch.zeros(n, dtype=torch.long),
                                      [False] * n, t["in_ref_audio_tokens"]))
    replay = [t[k] for k in sorted(k for k in t if k.startswith("rng_"))]
    lengths = (batch.position_ids.max(dim=1).values + 1).tolist()
    return {"t": t, "progress": manifest["training"]["progress"], "micro": MicroBatch(batch, [0, 1], lengths),
            "replay": replay}


def _stage(fx: Path, monkeypatch, reference, **vx2) -> VoxCPM2Stage:
    """A set-up stage whose step replays the fixture's draws, at the fixture's progress (step 1 of 4)."""
    assert reference["progress"] == 0.25
    torch.manual_seed(0)
    stage = VoxCPM2Stage(config(fx, steps=4, **vx2), fx)
    stage.setup(torch.device("cpu"), lambda m: m)
    monkeypatch.setattr(stage, "_noise", lambda micro, step, salt: TrainingNoise(replay=reference["replay"]))
    return stage


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_train_step_reproduces_the_reference_losses(fx, monkeypatch, reference, mode):
    """Fresh adapters add zero, so both modes give the reference's losses for the fixture's batch."""
    stage = _stage(fx, monkeypatch, reference, mode=mode)
    metrics = stage.train_step([reference["micro"]], step=1)
    t = reference["t"]
    assert_close(torch.tensor(metrics["loss_diff"]), t["loss_diff"][0], LOSS_TOL, "loss/diff")
    assert_close(torch.tensor(metrics["loss_stop"]), t["loss_stop"][0], LOSS_TOL, "loss/stop")
    assert metrics["grad_norm"] > 0 and metrics["target_patches"] == float(reference["micro"].batch.loss_mask.sum())


def test_a_bf16_autocast_step_stays_near_the_reference(fx, monkeypatch, reference):
    """What ``train.mixed_precision: bf16`` (or ``auto`` on CUDA / AMX CPUs) runs: float32 weights, bf16 matmuls."""
    stage = _stage(fx, monkeypatch, reference, mode="lora")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        metrics = stage.train_step([reference["micro"]], step=1)
    t = reference["t"]
    assert abs(metrics["loss_diff"] - float(t["loss_diff"][0])) < 0.05
    assert abs(metrics["loss_stop"] - float(t["loss_stop"][0])) < 0.02
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in stage.params)


def test_a_lora_step_changes_only_lora_parameters(fx, monkeypatch, reference):
    stage = _stage(fx, monkeypatch, reference, mode="lora", lora_r=4, lora_alpha=8.0)
    before = {n: p.detach().clone() for n, p in stage.model.named_parameters()}
    assert {n for n, p in stage.model.named_parameters() if p.requires_grad} == {n for n in before if ".lora_" in n}
    targets = {n.rsplit(".", 2)[0] for n in before if ".lora_" in n}
    assert any(t.startswith("base_lm.") for t in targets) and any(t.startswith("residual_lm.") for t in targets)
    assert any(t.startswith("feat_decoder.estimator.") for t in targets)
    assert not any(t.endswith("_proj") and "." not in t for t in targets)  # release default: projections off
    stage.train_step([reference["micro"]], step=1)
    for name, p in stage.model.named_parameters():
        if ".lora_" in name:
            if name.endswith("lora_B"):
                assert not torch.equal(p, before[name]), f"{name} did not train"
        else:
            assert torch.equal(p, before[name]), f"{name} changed in a LoRA-only step"


def test_data_checks_and_the_latent_cache(fx, tmp_path, monkeypatch):
    sf.write(tmp_path / "silent.wav", np.zeros(16000, np.float32), 16000)
    sf.write(tmp_path / "short.wav", 0.3 * np.sin(np.arange(3200) / 8.0).astype(np.float32), 16000)
    data = write_manifest(tmp_path / "data", fx, [
        {"audio": str(tmp_path / "silent.wav"), "text": "Hello there."},
        {"audio": str(tmp_path / "short.wav"), "text": "Hello."},
        {"audio": str(tmp_path / "missing.wav"), "text": "Hello."},
        {"audio": str(fx / "wavs" / "ref_16k.wav"), "text": "!!!"},
        {"audio": str(fx / "wavs" / "ref_16k.wav"), "text": "hello " * 60},  # 360 letters in 1.3 s
    ])
    stage = VoxCPM2Stage(config(fx, cache_dir=str(tmp_path / "cache")), data)
    stage.setup(torch.device("cpu"), lambda m: m)
    items = stage.dataset()
    assert len(items) == 6 and stage.packer.dataset_count == 2
    cache_dirs = list((tmp_path / "cache").iterdir())
    assert len(cache_dirs) == 1 and cache_dirs[0].name.endswith("-p4")
    names = sorted(p.name for p in cache_dirs[0].iterdir())
    assert sum(n.endswith(".safetensors") for n in names) == 2  # each clip encoded once, the reference included
    reasons = [json.loads(p.read_text())["category"] for p in cache_dirs[0].glob("*.rejected.json")]
    assert sorted(reasons) == ["missing", "silent", "too_short"]
    item = items[2]
    assert item["ref_patches"] is not None and item["patches"].shape[1:] == (4, 16)
    import cadenza.models.voxcpm2.audio_vae_loader as vae_loader

    def no_vae(*a, **k):
        raise AssertionError("a cached clip was encoded again")

    monkeypatch.setattr(vae_loader, "load_audio_vae", no_vae)
    again = VoxCPM2Stage(config(fx, cache_dir=str(tmp_path / "cache")), data)
    again.setup(torch.device("cpu"), lambda m: m)
    assert len(again.dataset()) == 6
    batch = again.collate([items[i] for i in range(2)])
    assert len(batch) == 1 and batch[0].batch.text_tokens.shape[0] == 2


def test_heldout_losses_are_logged_and_reproducible(fx, tmp_path):
    data = write_manifest(tmp_path / "data", fx)
    cfg = config(fx, steps=2, heldout_fraction=0.34, eval_every=1)
    metrics = run(cfg, data, tmp_path / "run")
    assert all("heldout_loss" in m and m["heldout_items"] == 2 for m in metrics)
    stage = VoxCPM2Stage(cfg, data)
    stage.setup(torch.device("cpu"), lambda m: m)
    stage.dataset()
    assert stage.evaluate() == stage.evaluate()


def test_resume_continues_the_same_loss_curve(fx, tmp_path):
    """A run stopped after its step-2 checkpoint (the step-4 one removed) resumes to the same steps 3 and 4."""
    data = write_manifest(tmp_path / "data", fx)
    cfg = config(fx, steps=4)
    cfg["train"].update(ckpt_every=2, keep_checkpoints=0)
    full = run(cfg, data, tmp_path / "full")
    (tmp_path / "full" / "checkpoints" / "step_4.pt").unlink()
    resumed = run(cfg, data, tmp_path / "full", resume=True)
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(full, resumed):
        assert abs(a["loss"] - b["loss"]) <= 1e-6, (a, b)


def test_two_ddp_processes_match_one_process_with_micro_batches(fx, tmp_path):
    """torchrun --nproc_per_node 2 (gloo), batch 2 each == one process with batch 4 in two micro-batches of 2."""
    data = write_manifest(tmp_path / "data", fx)
    cfg = config(fx, steps=3, grad_accum_steps=1)  # the CLI's recipe would otherwise bring 8
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cadenza.cli.train", "voxcpm2", "--config", str(tmp_path / "ddp.yaml"), "--data", str(data),
         "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = config(fx, steps=3, batch=4, grad_accum_steps=2)
    one = run(single, data, tmp_path / "single")
    ddp = read_metrics(tmp_path / "ddp")
    assert len(ddp) == 3 and load_checkpoint(tmp_path / "ddp" / "checkpoints" / "step_3.pt")["world_size"] == 2
    for a, b in zip(ddp, one):
        for key in ("loss", "loss_diff", "loss_stop"):
            assert abs(a[key] - b[key]) <= 1e-5, (key, a, b)
    a = load_file(str(tmp_path / "ddp" / "lora_weights.safetensors"))
    b = load_file(str(tmp_path / "single" / "lora_weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def _torchrun(tmp_path: Path, cfg: dict, data: Path, out: str, *extra: str) -> None:
    (tmp_path / f"{out}.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "cadenza.cli.train", "voxcpm2", "--config", str(tmp_path / f"{out}.yaml"), "--data", str(data),
         "--out", str(tmp_path / out), *extra],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_fsdp_over_two_processes_matches_one_process_and_resumes(fx, tmp_path):
    """voxcpm2.fsdp (FSDP2 over 2 gloo processes, full fine-tuning): the same losses and weights as one process with
    the doubled batch; its checkpoints hold whole tensors in the model's names (they load into an unsharded stage)
    and a sharded run resumes from them."""
    data = write_manifest(tmp_path / "data", fx)
    sharded = config(fx, steps=3, grad_accum_steps=1, mode="full", fsdp=True)
    sharded["train"]["ckpt_every"] = 2
    _torchrun(tmp_path, sharded, data, "fsdp")
    (tmp_path / "fsdp" / "checkpoints" / "step_3.pt").unlink()
    _torchrun(tmp_path, sharded, data, "fsdp", "--resume")  # from step 2: loads whole tensors into shards
    one = run(config(fx, steps=3, batch=4, grad_accum_steps=2, mode="full"), data, tmp_path / "single")
    got = read_metrics(tmp_path / "fsdp")
    assert [m["step"] for m in got] == [1, 2, 3]
    for a, b in zip(got, one):
        for key in ("loss", "loss_diff", "loss_stop", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(b[key])), (key, a, b)
    a = load_file(str(tmp_path / "fsdp" / "model.safetensors"))
    b = load_file(str(tmp_path / "single" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)  # as DDP's, above
    assert any(not torch.equal(a[k], v) for k, v in load_model(fx / "tiny_model").state_dict().items())
    state = load_checkpoint(tmp_path / "fsdp" / "checkpoints" / "step_3.pt")["state"]
    stage = VoxCPM2Stage(config(fx, steps=3, mode="full"), fx)
    stage.setup(torch.device("cpu"), lambda m: m)
    stage.load_state_dict(state)  # strict: every name and shape of an unsharded model and optimiser
    assert all(torch.equal(v, a[k]) for k, v in stage.model.state_dict().items() if k in a)


def test_full_run_exports_a_model_folder(fx, tmp_path):
    import cadenza

    data = write_manifest(tmp_path / "data", fx)
    run(config(fx, steps=2, mode="full"), data, tmp_path / "full")
    out = tmp_path / "full"
    for name in ("config.json", "model.safetensors", "audiovae.pth", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        assert (out / name).is_file(), name
    trained, base = load_model(out), load_model(fx / "tiny_model")
    changed = [n for n, p in trained.state_dict().items() if not torch.equal(p, base.state_dict()[n])]
    assert "base_lm.layers.0.self_attn.q_proj.weight" in changed and "stop_head.weight" in changed
    audio = cadenza.load(out).synthesize("Hello the world.", seed=1)
    assert audio.samples.size > 0 and np.isfinite(audio.samples).all()


def test_bad_configs_are_refused(fx, tmp_path):
    with pytest.raises(InputError, match="mode"):
        VoxCPM2Stage(config(fx, mode="qlora"), tmp_path)
    with pytest.raises(InputError, match="multiple of voxcpm2.grad_accum_steps"):
        VoxCPM2Stage(config(fx, batch=3, grad_accum_steps=2), tmp_path)
    with pytest.raises(InputError, match="model folder"):
        VoxCPM2Stage({"train": {}, "voxcpm2": {}}, tmp_path)
    with pytest.raises(InputError, match="lora_rr"):
        VoxCPM2Stage(config(fx, lora_rr=4), tmp_path)
    with pytest.raises(InputError, match="LoRA rank"):
        VoxCPM2Stage(config(fx, lora_r=0), tmp_path)
    with pytest.raises(InputError, match="manifest not found"):
        stage = VoxCPM2Stage(config(fx), tmp_path)
        stage.setup(torch.device("cpu"), lambda m: m)
        stage.dataset()
