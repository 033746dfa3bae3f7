"""CAM++-style speaker encoder: the "speaker" training stage on synthetic speakers (harmonic sources with
speaker-specific pitch and formants), metrics, export and reload."""

from __future__ import annotations

import json
import math

import pytest
import soundfile as sf
import torch
import torch.nn.functional as F

from cadenza.audio.kaldi_fbank import campplus_features
from cadenza.errors import CheckpointError, InputError
from cadenza.models.speaker_encoder import (
    CONFIG_NAME,
    SpeakerEncoderConfig,
    SpeakerEncoderModel,
    find_speaker_encoder,
    load_speaker_encoder,
)
from cadenza.training.speaker_encoder_stage import AAMSoftmax, SpeakerEncoderStage, equal_error_rate
from helpers import one_torch_thread

SR = 16000
# (mean f0 in Hz, formant frequencies in Hz) per synthetic speaker
SPEAKERS = [(100.0, (500.0, 1500.0, 2500.0)), (150.0, (700.0, 1100.0, 2900.0)),
            (210.0, (350.0, 2200.0, 3200.0)), (260.0, (800.0, 1700.0, 3700.0))]
TINY = {"fcm_channels": 8, "fcm_blocks": [1, 1], "tdnn_channels": 32, "growth_rate": 16, "bottleneck_scale": 2,
        "block_layers": [2, 2], "block_kernels": [3, 3], "block_dilations": [1, 2], "embedding_size": 64,
        "cam_segment_frames": 20}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _voice(f0_mean: float, formants: tuple[float, ...], g: torch.Generator, seconds: float = 1.0) -> torch.Tensor:
    """Harmonics of a slowly wobbling f0, weighted by a speaker's formant envelope, plus a little noise."""
    n = int(seconds * SR)
    t = torch.arange(n) / SR
    f0 = f0_mean * (1 + 0.1 * torch.sin(2 * math.pi * (0.5 + torch.rand(1, generator=g)) * t
                                        + 6 * torch.rand(1, generator=g)))
    phase = 2 * math.pi * torch.cumsum(f0, 0) / SR
    wav = torch.zeros(n)
    for h in range(1, 40):
        fh = h * f0
        envelope = sum(torch.exp(-(((fh - f) / (0.12 * f)) ** 2)) for f in formants) + 0.02
        wav += envelope * torch.sin(h * phase) * (fh < SR / 2)
    return 0.5 * wav / wav.abs().max() + 0.01 * torch.randn(n, generator=g)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    with one_torch_thread():
        return _write_data(tmp_path_factory)


def _write_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("speaker_data")
    (d / "wavs").mkdir()
    g = torch.Generator().manual_seed(1)
    rows = []
    for s, (f0, formants) in enumerate(SPEAKERS):
        for u in range(8):
            name = f"wavs/s{s}_{u}.wav"
            sf.write(d / name, _voice(f0, formants, g).numpy(), SR)
            rows.append({"audio": name, "speaker": f"spk{s}", "text": "unused"})
    (d / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d


CONFIG = {"train": {"optim": {"lr": 3e-3, "warmup_steps": 5}},
          "speaker": {"model": TINY, "margin": 0.2, "scale": 16.0, "margin_warmup_steps": 10,
                      "heldout_fraction": 0.25, "crop_seconds": 0.6}}


def test_speaker_stage_trains_separates_speakers_and_exports(data_dir, tmp_path):
    torch.manual_seed(0)
    stage = SpeakerEncoderStage(CONFIG, data_dir)
    stage.setup(torch.device("cpu"), lambda m: m)
    assert len(stage.speakers) == 4 and len(stage.heldout_idx) == 8  # 2 held out per speaker
    before = stage.evaluate()

    loader = torch.utils.data.DataLoader(stage.dataset(), batch_size=8, shuffle=True, collate_fn=stage.collate,
                                         drop_last=True)
    metrics: list[dict[str, float]] = []
    while len(metrics) < 60:
        for batch in loader:
            metrics.append(stage.train_step(batch, len(metrics)))
    first = sum(m["loss"] for m in metrics[:5]) / 5
    last = sum(m["loss"] for m in metrics[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    assert metrics[0]["margin"] == 0 and metrics[-1]["margin"] == pytest.approx(0.2)

    after = stage.evaluate()
    assert after["heldout_same_cos"] > after["heldout_diff_cos"] + 0.3, after
    assert after["heldout_cos_gap"] > before["heldout_cos_gap"]
    assert after["heldout_eer"] <= 0.1, after

    stage.export(tmp_path)
    assert find_speaker_encoder(tmp_path) is not None
    doc = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert doc["metadata"]["heldout_eer"] == pytest.approx(after["heldout_eer"])

    encoder = load_speaker_encoder(tmp_path)
    source = stage.source
    embeddings = []
    for index in stage.heldout_idx:
        emb = encoder(campplus_features(source.load(index, SR)[0]))
        assert emb.shape == (1, TINY["embedding_size"]) and emb.dtype == torch.float32
        embeddings.append(emb[0])
    reference = stage.embeddings(stage.heldout_idx)
    assert torch.allclose(torch.stack(embeddings), reference, atol=1e-5)
    # Scale does not matter: cosine of the reloaded embeddings separates the held-out speakers.
    e = F.normalize(torch.stack(embeddings), dim=-1)
    speakers = [source.meta(i).speaker for i in stage.heldout_idx]
    same = [float(e[i] @ e[j]) for i in range(8) for j in range(i + 1, 8) if speakers[i] == speakers[j]]
    diff = [float(e[i] @ e[j]) for i in range(8) for j in range(i + 1, 8) if speakers[i] != speakers[j]]
    assert min(same) > max(diff)

    from cadenza.data.extractors import Utterance, load_extractor

    extractor = load_extractor(f"cadenza.training.speaker_encoder_stage:speaker_embedding_extractor={tmp_path}")
    wav = source.load(stage.heldout_idx[0], SR)[0]
    spk_emb = extractor(Utterance("u", "text", wav, SR))["spk_emb"]
    assert spk_emb.shape == (TINY["embedding_size"],) and torch.allclose(spk_emb, embeddings[0], atol=1e-5)

    resumed = SpeakerEncoderStage(CONFIG, data_dir)
    resumed.setup(torch.device("cpu"), lambda m: m)
    resumed.load_state_dict(stage.state_dict())
    assert torch.allclose(resumed.embeddings(stage.heldout_idx[:2]), reference[:2])


def test_equal_error_rate():
    same = torch.tensor([True, True, False, False])
    assert equal_error_rate(torch.tensor([0.9, 0.8, 0.2, 0.1]), same) == 0.0
    assert equal_error_rate(torch.tensor([0.1, 0.2, 0.8, 0.9]), same) == 1.0
    # One same-pair below one different-pair out of two each: FAR = FRR = 0.5 at the crossing.
    assert equal_error_rate(torch.tensor([0.9, 0.3, 0.5, 0.1]), same) == pytest.approx(0.5)
    assert math.isnan(equal_error_rate(torch.tensor([0.5]), torch.tensor([True])))


def test_aam_margin_penalises_the_target():
    torch.manual_seed(0)
    head = AAMSoftmax(8, 3, scale=10.0)
    emb, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    plain, _ = head(emb, labels, 0.0)
    with_margin, _ = head(emb, labels, 0.3)
    assert with_margin > plain
    cos = F.linear(F.normalize(emb), F.normalize(head.weight))
    assert torch.allclose(plain, F.cross_entropy(10.0 * cos, labels), atol=1e-5)


def test_model_interface_and_validation(tmp_path):
    model = SpeakerEncoderModel(SpeakerEncoderConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                       for k, v in TINY.items()})).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 57, 80)).shape == (2, 64)
        with pytest.raises(InputError, match="frames"):
            model(torch.randn(1, 3, 80))
        with pytest.raises(InputError, match="80"):
            model(torch.randn(1, 50, 40))
    assert SpeakerEncoderConfig().embedding_size == 192
    with pytest.raises(InputError, match="unknown keys"):
        SpeakerEncoderConfig.from_dict({"emb": 3})
    with pytest.raises(CheckpointError, match="not found"):
        load_speaker_encoder(tmp_path)


def test_stage_needs_speakers(tmp_path):
    sf.write(tmp_path / "a.wav", torch.zeros(SR).numpy(), SR)
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"audio": "a.wav", "text": "x"}) + "\n")
    with pytest.raises(InputError, match="speaker"):
        SpeakerEncoderStage({"speaker": {"model": TINY}}, tmp_path).dataset()


def test_example_config_runs_through_the_launcher(data_dir, tmp_path):
    """``configs/train/speaker_tiny.yaml`` is valid and its stage trains, checkpoints and exports via the launcher."""
    from pathlib import Path

    from cadenza.training.launcher import train

    config = Path(__file__).resolve().parents[2] / "configs" / "train" / "speaker_tiny.yaml"
    out = train("speaker", config, data_dir, tmp_path, max_steps=2)
    assert all((out / name).is_file() for name in ("speaker_encoder.safetensors", "speaker_encoder.json"))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines and math.isfinite(json.loads(lines[-1])["loss"])
