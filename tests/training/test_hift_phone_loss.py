"""The vocoder's phone loss (training/hift/phone_loss.py): whisper's analysis at the vocoder's rate, the loss on
real speech of the built-in model (it hears a lost onset that the mel loss barely sees), and the "hift" stage training
with it (the tiny stage set-up of test_train_hift.py)."""

from __future__ import annotations

import math

import pytest
import soxr
import torch

from cadenza.audio.whisper_mel import whisper_log_mel_from_power, whisper_power
from cadenza.builtin import builtin_model_dir
from cadenza.errors import AudioError, CheckpointError, InputError
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.inference import save_speech_tokenizer
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel
from cadenza.training.hift.config import HiFTLossConfig
from cadenza.training.hift.losses import loss_mel_config, mel_l1_loss
from cadenza.training.hift.phone_loss import PhoneLoss
from cadenza.training.hift_stage import HiFTStage
from helpers import one_torch_thread
from hift_training_data import CONFIG, SR


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _chirp(sr: int, seconds: float = 1.0) -> torch.Tensor:
    t = torch.arange(int(sr * seconds)) / sr
    f = 150 + 3000 * t  # sweeps 150 Hz -> 3.15 kHz
    return 0.3 * torch.sin(2 * math.pi * torch.cumsum(f, 0) / sr) * (1 + 0.5 * torch.sin(2 * math.pi * 3 * t))


def test_whisper_analysis_at_24k_matches_resampling_to_16k():
    """Read at 24 kHz with a 600-point window every 240 samples, bins 0-200 are whisper's 16 kHz bins: the log-mel
    agrees with resampling first, up to the resampler's filter."""
    wav24 = _chirp(SR)
    wav16 = torch.from_numpy(soxr.resample(wav24.numpy(), SR, 16000))
    direct = whisper_log_mel_from_power(whisper_power(wav24, sample_rate=SR))
    resampled = whisper_log_mel_from_power(whisper_power(wav16))
    assert direct.shape == resampled.shape == (1, 128, 100)
    assert (direct - resampled).abs()[..., 2:-2].mean() < 0.01  # the log-mel spans ~2 units
    assert torch.equal(whisper_power(wav16), whisper_power(wav16, sample_rate=16000))
    for bad in (8000, 22050, 16100):
        with pytest.raises(AudioError, match="sample rate"):
            whisper_power(wav24, sample_rate=bad)


def frame_classifier(classes: int = 12) -> SpeechTokenizerModel:
    cfg = SpeechTokenizerConfig(n_mels=128, hidden_size=32, num_heads=2, ffn_size=64, encoder1_layers=1,
                                encoder2_layers=0, frame_classes=classes)
    return SpeechTokenizerModel(cfg)


def test_phone_loss_is_zero_on_itself_and_trains_only_the_fake():
    torch.manual_seed(0)
    loss = PhoneLoss(frame_classifier(), SR)
    real = _chirp(SR)[None].repeat(2, 1)
    same = loss(real, real.clone())
    assert same.feature == 0 and same.posterior.abs() < 1e-6
    fake = (real + 0.05 * torch.randn_like(real)).requires_grad_(True)
    out = loss(real, fake)
    assert out.feature > 0 and out.posterior > 0
    (out.feature + out.posterior).backward()
    assert fake.grad is not None and fake.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in loss.recogniser.parameters())
    loss.train()
    assert not loss.recogniser.training  # a fixed instrument, whatever the stage's mode
    with pytest.raises(InputError, match="one shape"):
        loss(real, fake[:, :-1])
    fsq = SpeechTokenizerModel(SpeechTokenizerConfig(n_mels=128, hidden_size=32, num_heads=2, ffn_size=64,
                                                     encoder1_layers=1, encoder2_layers=0, vocab_size=0))
    with pytest.raises(InputError, match="frame-classifier"):
        PhoneLoss(fsq, SR)


def test_builtin_recogniser_hears_lost_onsets_the_mel_loss_barely_sees(builtin_tts):
    """What the loss is for: on the built-in model's own speech, three onsets cut (50 ms each, 95 % quieter) move
    the log-mel L1 less than a 30 dB white noise does, yet move the recogniser's phone posteriors far more."""
    speech = builtin_tts.synthesize("Please put the big cup on the desk.", seed=0)
    assert speech.sample_rate == SR
    real = torch.from_numpy(speech.samples).float()[None]
    loss = PhoneLoss.from_path(builtin_model_dir(), SR)
    mel_cfg = loss_mel_config(HiFTLossConfig(), SR)

    noise = torch.randn(real.shape, generator=torch.Generator().manual_seed(0))
    noisy = real + noise * real.std() / noise.std() / 10 ** (30 / 20)
    energy = real[0].reshape(-1, 240).pow(2).mean(1)
    onsets = (energy[2:] - energy[:-2]).topk(3).indices
    cut = real.clone()
    for i in onsets.tolist():
        cut[0, i * 240: i * 240 + 1200] *= 0.05

    assert mel_l1_loss(real, cut, mel_cfg) < 0.5 * mel_l1_loss(real, noisy, mel_cfg)
    assert loss(real, cut).posterior > 2 * loss(real, noisy).posterior


def test_stage_trains_with_the_phone_loss(hift_corpus, tmp_path):
    """A frame-classifier speech tokenizer (random weights here) as the recogniser of the "hift" stage."""
    save_speech_tokenizer(frame_classifier(), tmp_path / "recogniser")
    cfg = {**CONFIG, "hift": {**CONFIG["hift"], "adversarial_start": 1, "phone_model": str(tmp_path / "recogniser"),
                              "loss": {"phone_feature_weight": 3.0, "phone_posterior_weight": 1.0}}}
    torch.manual_seed(0)
    stage = HiFTStage(cfg, hift_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    batch = [stage.dataset()[i] for i in range(3)]
    metrics = [stage.train_step(batch, step) for step in range(2)]  # a warm-up step and a GAN step
    assert all(m["loss_phone_feature"] > 0 and m["loss_phone_posterior"] > 0 for m in metrics)
    assert "recogniser" not in " ".join(stage.state_dict()["generator"])  # the recogniser is not trained or saved

    off = HiFTStage(CONFIG, hift_corpus)
    off.setup(torch.device("cpu"), lambda m: m)
    assert off.train_step(batch, 0)["loss_phone_feature"] == 0.0
    with pytest.raises(InputError, match="need hift.phone_model"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "loss": {"phone_posterior_weight": 1.0}}}, hift_corpus)
    missing = {**cfg, "hift": {**cfg["hift"], "phone_model": str(tmp_path / "nowhere")}}
    with pytest.raises(CheckpointError, match="nowhere"):
        HiFTStage(missing, hift_corpus).setup(torch.device("cpu"), lambda m: m)
    with pytest.raises(InputError, match="phone_feature_weight must be >= 0"):
        HiFTStage({**CONFIG, "hift": {**CONFIG["hift"], "loss": {"phone_feature_weight": -1.0}}}, hift_corpus)
