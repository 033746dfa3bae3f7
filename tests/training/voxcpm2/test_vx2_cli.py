"""End to end through the command line: a manifest over the fixture's wavs with made-up transcripts, a few LoRA steps
(``cadenza train voxcpm2``), synthesis with the adapter (``cadenza synth --lora`` and ``VoxCPM2.from_pretrained``),
and the adapter merged into a model folder (``--merge-lora``) that ``cadenza.load`` serves with the same output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from safetensors.torch import load_file

from cadenza.cli.main import main
from cadenza.models.voxcpm2.lora import LoRAConfig

TEXT = "Hello the world."


@pytest.fixture(scope="module")
def lora_run(vx2_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vx2_cli")
    data = root / "data"
    (data / "wavs").mkdir(parents=True)
    transcripts = ["Hello the world.", "This is a test, hello.", "The world is here.", "Hello, this is it."]
    wavs = sorted((vx2_dir / "wavs").glob("*.wav"))
    lines = []
    for i, text in enumerate(transcripts):
        wav = wavs[i % len(wavs)]
        shutil.copyfile(wav, data / "wavs" / wav.name)
        lines.append({"audio": f"wavs/{wav.name}", "text": text, "id": f"u{i}"})
    (data / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    # the release recipe (lr 1e-4, AdamW, cosine) at test size: 2 clips a step, 1 warm-up step
    overrides = {"train": {"batch_size": 2, "max_steps": 4, "log_every": 1, "progress": False, "tensorboard": False,
                           "mixed_precision": "no", "optim": {"warmup_steps": 1}},
                 "voxcpm2": {"grad_accum_steps": 1}}
    (root / "small.yaml").write_text(yaml.safe_dump(overrides))
    out = root / "run"
    assert main(["train", "voxcpm2", "--init", str(vx2_dir / "tiny_model"), "--data", str(data), "--out", str(out),
                 "--config", str(root / "small.yaml")]) == 0
    return {"root": root, "out": out, "data": data}


def _synth(model: Path, out: Path, *extra: str) -> np.ndarray:
    assert main(["synth", "--model", str(model), "--text", TEXT, "--seed", "1", "-o", str(out), *extra]) == 0
    audio, rate = sf.read(out, dtype="float32")
    assert rate == 48000 and audio.size > 0 and np.isfinite(audio).all()
    return audio


def test_the_run_writes_the_release_lora_files(vx2_dir, lora_run):
    out = lora_run["out"]
    doc = json.loads((out / "lora_config.json").read_text())
    assert doc["base_model"] == str(vx2_dir / "tiny_model")
    config = LoRAConfig.from_json(out / "lora_config.json")
    assert (config.r, config.alpha, config.dropout) == (32, 32.0, 0.0)
    assert config.enable_lm and config.enable_dit and not config.enable_proj
    weights = load_file(str(out / "lora_weights.safetensors"))
    fixture_names = set(load_file(str(vx2_dir / "tiny_lora" / "lora_weights.safetensors")))
    # the fixture's adapter (the reference trainer's names) minus its four bridge projections
    assert set(weights) == {n for n in fixture_names if not n.split(".")[0].endswith("_proj")}
    assert weights["base_lm.layers.0.self_attn.q_proj.lora_A"].shape == (32, 64)
    assert any(float(v.abs().sum()) > 0 for k, v in weights.items() if k.endswith("lora_B"))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and all("loss_diff" in m for m in metrics)
    assert (lora_run["data"] / ".voxcpm2_latents").is_dir()


def _engine_audio(model: Path, lora: Path | None = None) -> np.ndarray:
    """Synthesis below the API layer (whatever the API adds to its outputs, e.g. a mark keyed by the folder)."""
    from cadenza.engine.voxcpm2 import VoxCPM2Engine

    engine = VoxCPM2Engine.from_pretrained(model, lora=lora)
    try:
        return engine.synthesize(engine.build(TEXT, seed=1))
    finally:
        engine.close()


def test_synth_with_the_adapter_and_merged(vx2_dir, lora_run):
    from cadenza.api.voxcpm2 import VoxCPM2

    root, out = lora_run["root"], lora_run["out"]
    base = _synth(vx2_dir / "tiny_model", root / "base.wav")
    adapted = _synth(vx2_dir / "tiny_model", root / "lora.wav", "--lora", str(out))
    n = min(base.size, adapted.size)
    assert base.size != adapted.size or np.abs(base[:n] - adapted[:n]).max() > 1e-3, "the adapter changed nothing"
    api = VoxCPM2.from_pretrained(vx2_dir / "tiny_model", lora=out).synthesize(TEXT, seed=1).samples
    assert api.size == adapted.size and np.abs(api - adapted).max() <= 1e-4  # the WAV file is 16-bit
    merged = root / "merged"
    assert main(["train", "voxcpm2", "--merge-lora", str(out), "--init", str(vx2_dir / "tiny_model"),
                 "--out", str(merged)]) == 0
    import cadenza

    assert cadenza.load(merged).synthesize(TEXT, seed=1).samples.size == api.size
    folded, with_adapter = _engine_audio(merged), _engine_audio(vx2_dir / "tiny_model", out)
    assert folded.size == with_adapter.size and np.abs(folded - with_adapter).max() <= 1e-5


def test_cli_errors(vx2_dir, tmp_path, capsys):
    assert main(["train", "voxcpm2", "--init", str(vx2_dir / "tiny_model"), "--out", str(tmp_path / "x")]) != 0
    assert "--data" in capsys.readouterr().err
    assert main(["train", "lm", "--data", str(tmp_path), "--out", str(tmp_path / "x")]) != 0
    assert "--config" in capsys.readouterr().err
    assert main(["train", "lm", "--mode", "full", "--config", "c.yaml", "--data", str(tmp_path),
                 "--out", str(tmp_path / "x")]) != 0
    assert "voxcpm2 stage" in capsys.readouterr().err
    assert main(["train", "voxcpm2", "--merge-lora", str(tmp_path), "--out", str(tmp_path / "m")]) != 0
    assert "--init" in capsys.readouterr().err
