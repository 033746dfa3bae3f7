"""Feature extractors (docs/design.md, "Audio features"): filterbank and feature parity with ``features.npz``, Kaldi fbank properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cadenza.audio.filterbanks import kaldi_mel_banks, slaney_mel_filterbank
from cadenza.audio.kaldi_fbank import campplus_features, kaldi_fbank
from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.whisper_mel import WHISPER_HOP, whisper_log_mel
from cadenza.errors import AudioError
from cadenza.models.cosyvoice2.config import CosyVoice2Config, MelConfig
from helpers import assert_close


@pytest.fixture(scope="module")
def mel_cfg(cv2_dir) -> MelConfig:
    return CosyVoice2Config.from_files(cv2_dir / "config.yaml", cv2_dir / "CosyVoice-BlankEN" / "config.json").mel


@pytest.fixture(scope="module")
def feats(cv2_npz) -> dict[str, np.ndarray]:
    return cv2_npz("features")


def _tone(freq: float, sr: int, seconds: float, amp: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(sr * seconds), dtype=torch.float64) / sr
    return (amp * torch.sin(2 * math.pi * freq * t)).float()


# ---------------------------------------------------------------- filterbanks


def test_slaney_bank_matches_librosa_fixture(mel_cfg, feats):
    expected = feats["mel_basis_24k_nfft1920_80_fmax8000"]
    bank = slaney_mel_filterbank(mel_cfg.sampling_rate, mel_cfg.n_fft, mel_cfg.num_mels, mel_cfg.fmin, mel_cfg.fmax)
    assert bank.dtype == torch.float32
    assert_close(bank, expected, 1e-6, "slaney bank (flow)")


def test_slaney_bank_matches_whisper_bundled_filters(feats):
    expected = feats["whisper_mel_filters_128"]
    n_mels, n_bins = expected.shape
    bank = slaney_mel_filterbank(16000, 2 * (n_bins - 1), n_mels)  # whisper: mel(sr=16000, n_fft=400, n_mels)
    assert_close(bank, expected, 1e-6, "slaney bank (whisper)")


def test_slaney_bank_cache_is_keyed_by_every_argument():
    a = slaney_mel_filterbank(24000, 1920, 80, 0.0, 8000.0)
    b = slaney_mel_filterbank(24000, 1024, 80, 0.0, 8000.0)  # same fmax, other n_fft: must not share the bank
    assert a.shape == (80, 961) and b.shape == (80, 513)


def test_kaldi_banks_shape_and_triangles():
    bank = kaldi_mel_banks(80, 512, 16000.0)
    assert bank.shape == (80, 257)
    assert bool((bank >= 0).all()) and float(bank.max()) <= 1.0
    assert float(bank[:, -1].abs().max()) == 0.0  # Nyquist column carries no weight
    # Bin 0's triangle starts at 20 Hz: FFT bins below it are empty.
    assert float(bank[:, 0].abs().max()) == 0.0
    peaks = bank.argmax(dim=1)
    assert bool((peaks[1:] >= peaks[:-1]).all())  # centres increase with the bin index


def test_kaldi_banks_reject_bad_options():
    with pytest.raises(ValueError):
        kaldi_mel_banks(3, 512, 16000.0)
    with pytest.raises(ValueError):
        kaldi_mel_banks(80, 512, 16000.0, low_freq=9000.0)


# ---------------------------------------------------------------- flow prompt mel


def test_flow_prompt_mel_parity(mel_cfg, feats):
    wav = torch.from_numpy(feats["wav24k"])
    mel = flow_prompt_mel(wav, mel_cfg)
    assert mel.dtype == torch.float32
    assert_close(mel, feats["flow_prompt_mel"], 1e-4, "flow_prompt_mel")
    assert mel.shape[-1] == wav.shape[-1] // mel_cfg.hop_size
    # 1-D input gives the same batch-1 result.
    assert_close(flow_prompt_mel(wav[0], mel_cfg), mel.numpy(), 0.0, "flow_prompt_mel 1-D")


def test_flow_prompt_mel_frame_count_and_errors(mel_cfg):
    for n in (mel_cfg.n_fft, mel_cfg.n_fft + mel_cfg.hop_size - 1, 5 * mel_cfg.hop_size + 7):
        mel = flow_prompt_mel(torch.randn(n) * 0.1, mel_cfg)
        assert mel.shape == (1, mel_cfg.num_mels, n // mel_cfg.hop_size)
    with pytest.raises(AudioError, match="too short"):
        flow_prompt_mel(torch.zeros(10), mel_cfg)


def test_flow_prompt_mel_silence_hits_floor(mel_cfg):
    # sqrt(1e-9) magnitude through the bank stays below the 1e-5 floor, so silence is exactly log(1e-5).
    mel = flow_prompt_mel(torch.zeros(mel_cfg.n_fft * 2), mel_cfg)
    assert torch.allclose(mel, torch.full_like(mel, math.log(1e-5)))


# ---------------------------------------------------------------- whisper log-mel


def test_whisper_log_mel_parity(feats):
    wav = torch.from_numpy(feats["wav16k"])
    expected = feats["whisper_logmel128"]
    logmel = whisper_log_mel(wav, n_mels=expected.shape[1])
    assert_close(logmel, expected, 1e-4, "whisper_logmel128")
    assert logmel.shape[-1] == wav.shape[-1] // WHISPER_HOP


def test_whisper_log_mel_batch_uses_per_utterance_max(feats):
    wav = torch.from_numpy(feats["wav16k"])[0]
    loud, quiet = wav, wav * 1e-3
    batch = whisper_log_mel(torch.stack([loud, quiet]))
    assert_close(batch[0], whisper_log_mel(loud)[0].numpy(), 1e-6, "batch row 0")
    assert_close(batch[1], whisper_log_mel(quiet)[0].numpy(), 1e-6, "batch row 1")


# ---------------------------------------------------------------- Kaldi fbank (no fixture: properties + references)


@pytest.mark.parametrize("n", [400, 401, 559, 560, 16000, 16877])
def test_kaldi_fbank_frame_count(n):
    feats = kaldi_fbank(torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1)
    assert feats.shape == (1 + (n - 400) // 160, 80)
    assert feats.dtype == torch.float32


def test_kaldi_fbank_too_short():
    with pytest.raises(AudioError, match="too short for fbank"):
        kaldi_fbank(torch.zeros(399))


@pytest.mark.parametrize("freq", [300.0, 1000.0, 3000.0, 6500.0])
def test_kaldi_fbank_tone_lands_in_its_mel_bin(freq):
    feats = kaldi_fbank(_tone(freq, 16000, 0.5))
    # Expected bin: the triangle whose centre (equally spaced on 1127 ln(1 + f/700) from 20 Hz to 8 kHz) is nearest.
    mel = lambda f: 1127.0 * math.log(1.0 + f / 700.0)  # noqa: E731
    delta = (mel(8000.0) - mel(20.0)) / 81
    centres = [mel(20.0) + (i + 1) * delta for i in range(80)]
    expected = min(range(80), key=lambda i: abs(centres[i] - mel(freq)))
    winners = feats.argmax(dim=1)
    assert set(winners.tolist()) <= {expected - 1, expected, expected + 1}
    assert int(torch.mode(winners).values) == expected


def _kaldi_fbank_float64(x: np.ndarray, sr: int = 16000, n_mels: int = 80) -> np.ndarray:
    """Straight-from-the-definition Kaldi fbank in float64 numpy (independent of the module's code path)."""
    x = np.asarray(x, np.float64)
    win, hop, nfft = 400, 160, 512
    frames = np.stack([x[i * hop : i * hop + win] for i in range(1 + (len(x) - win) // hop)])
    frames = frames - frames.mean(1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * 0.03, frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / (win - 1))) ** 0.85
    power = np.abs(np.fft.rfft(frames * window, nfft)) ** 2

    def mel(f):
        return 1127.0 * np.log1p(np.asarray(f) / 700.0)

    edges = np.linspace(mel(20.0), mel(sr / 2), n_mels + 2)
    fft_mel = mel(np.arange(nfft // 2 + 1) * sr / nfft)
    bank = np.stack(
        [
            np.clip(np.minimum((fft_mel - lo) / (c - lo), (hi - fft_mel) / (hi - c)), 0, None)
            for lo, c, hi in zip(edges[:-2], edges[1:-1], edges[2:])
        ]
    )
    bank[:, -1] = 0.0
    return np.log(np.maximum(power @ bank.T, np.finfo(np.float32).eps))


def test_kaldi_fbank_matches_float64_definition(feats):
    wav = feats["wav16k"][0]
    # float32 vs float64: differences grow only where energies approach the eps floor (log of tiny numbers).
    assert_close(kaldi_fbank(torch.from_numpy(wav)), _kaldi_fbank_float64(wav), 1e-3, "kaldi fbank vs float64")


def test_kaldi_fbank_matches_kaldi_native_fbank(feats):
    knf = pytest.importorskip("kaldi_native_fbank")
    wav = feats["wav16k"][0]
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = 16000
    opts.mel_opts.num_bins = 80
    online = knf.OnlineFbank(opts)
    online.accept_waveform(16000, wav.tolist())
    online.input_finished()
    expected = np.stack([online.get_frame(i) for i in range(online.num_frames_ready)])
    # kaldi-native-fbank is close but not bit-identical to torchaudio's fbank (own FFT and bank arithmetic).
    assert_close(kaldi_fbank(torch.from_numpy(wav)), expected, 2e-3, "kaldi fbank vs kaldi-native-fbank")


def test_campplus_features_mean_removed_and_scale_invariant(feats):
    wav = torch.from_numpy(feats["wav16k"][0])
    out = campplus_features(wav)
    assert out.shape == (1, 1 + (wav.numel() - 400) // 160, 80)
    assert float(out.mean(dim=1).abs().max()) < 1e-5
    # int16-scaled input only adds a constant to every log energy, which the mean removal cancels.
    assert_close(campplus_features(wav * 32768.0), out.numpy(), 1e-3, "campplus scale invariance")
