"""Naturalness: an automatic MOS proxy, DistillMOS (variant 7), on a 1-5 scale.

DistillMOS (Stahl & Gamper, "Distillation and Pruning for Scalable Self-Supervised Representation-Based Speech
Quality Assessment", ICASSP 2025; the ``distillmos`` 0.9.1 wheel, MIT licence) is a small student model (a CNN on a
compressed complex spectrogram, a 7-layer transformer and attention pooling) distilled from a speech-quality model
built on wav2vec 2.0 XLS-R features. Its model card lists the training data: human MOS ratings of PSTN, NISQA,
ConferencingSpeech 2022, VoiceMOS 2022 and of noise-suppression, packet-loss-concealment and signal-improvement
challenge submissions, plus unlabelled DNS-challenge speech and noise and the output of public (Coqui) TTS models;
mostly English. It predicts the mean opinion score a listener panel would give, from 1 (bad) to 5 (excellent).

The weights are the ones that ship in the wheel (``distillmos/weights/distill_mos_v7.pt``); the network is our
own implementation with the same parameter names, so nothing of the wheel's code is imported (its ``__init__``
imports torchaudio, which Cadenza does not depend on). Scores match the package's ``ConvTransformerSQAModel`` in
eval mode to within 1e-4 (tests/evaluation/test_naturalness.py). As in the package, audio is taken to 16 kHz mono,
cut into 7.68 s windows (hops of at most 1 s; a shorter clip is zero-padded to one window), each window is
peak-normalised and scored, and the scores are averaged.

Calibration, measured on this machine: real speech and renderings of the Piper "joe" voice (cadenza-tiny's teacher)
score about 4.2 (the shared test recordings 4.25-4.58, 4.17 over 60 teacher clips; the English recording falls from
4.30 to 1.32 with white noise at 0 dB SNR); cadenza-tiny's current output scores about 1.3 (1.33 for its TTS, 1.31
for its vocoder's copy synthesis of the teacher). It is a proxy trained on ratings of other systems, not a
listening test: compare figures only with figures from this same tool.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cadenza.errors import AudioError, CheckpointError, MissingDependencyError
from cadenza.evaluation.audio import EVAL_SR, load_16k, to_16k_mono

NATURALNESS_NAME = "DistillMOS v7 (MOS proxy)"
INSTALL_HINT = "pip install --no-deps distillmos==0.9.1"
WEIGHTS_FILE = Path("weights") / "distill_mos_v7.pt"  # inside the installed distillmos package folder

WINDOW = 122_880  # samples per scored window at EVAL_SR: 7.68 s at 16 kHz -> 768 STFT frames -> 384 transformer steps
MAX_HOP = 16_000  # at most 1 s between window starts on longer clips
SILENCE_PEAK = 1e-4  # -80 dBFS: below this there is nothing to score (peak normalisation would amplify ~nothing)
WINDOWS_PER_BATCH = 8  # bounds memory on long clips: the first conv layer alone is ~31 MB per window

_N_FFT = 320  # 20 ms
_HOP = 160  # 10 ms
_CNN_CHANNELS = (64, 64, 128, 256, 256, 256)
_FEAT_FREQ = 4  # frequency bins left after the CNN: 161 -> 159 -> 79 -> 39 -> 19 -> 9 -> 4
_DIM_INPUT = _CNN_CHANNELS[-1] * _FEAT_FREQ  # 1024
_DIM_MODEL = 200
_N_HEADS = 8
_N_LAYERS = 7
_SEQ_LEN = WINDOW // _HOP // 2  # 384: the last conv layer halves the time axis


def compressed_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """Power-law (0.3) compressed complex STFT. ``wav``: ``[batch, samples]`` at 16 kHz -> ``[batch, 2, 161,
    frames]`` (real and imaginary parts, frequency, time; ``frames = samples // 160``), magnitude ``|X| ** 0.3`` with
    the phase of ``X``."""
    pad = (_N_FFT - _HOP) // 2
    x = F.pad(wav, (pad, pad), mode="reflect")
    window = torch.hann_window(_N_FFT, dtype=x.dtype, device=x.device)
    spec = torch.view_as_real(torch.stft(x, n_fft=_N_FFT, hop_length=_HOP, win_length=_N_FFT, window=window,
                                         center=False, return_complex=True))  # [batch, 161, frames, 2]
    mag = spec.pow(2).sum(dim=-1, keepdim=True).sqrt().clamp_min(1e-12)
    return (mag.pow(0.3) * spec / mag).permute(0, 3, 1, 2)


class _SpectrogramCNN(nn.Module):
    """Six 3x3 convolutions with leaky ReLUs: ``[batch, samples]`` -> ``[batch, 1024, samples // 320]`` (256
    channels x 4 frequency bins per time step). Frequency is strided by 2 from the second layer on, time by 2 in the
    last one; there is no padding along frequency."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 2
        for i, channels in enumerate(_CNN_CHANNELS):
            stride = (2 if i >= 1 else 1, 2 if i == len(_CNN_CHANNELS) - 1 else 1)  # (frequency, time)
            layers += [nn.Conv2d(in_channels, channels, (3, 3), stride=stride, padding=(0, 1)), nn.LeakyReLU(0.1)]
            in_channels = channels
        self.cnn = nn.Sequential(*layers)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        return self.cnn(compressed_spectrogram(wav)).flatten(1, 2)


class _PositionEncoding(nn.Module):
    """Fixed sinusoidal position table ``pe`` ``[1, 384, 200]`` (wavelengths up to 2 * 384 steps), added to the
    input; it is stored in the checkpoint as well."""

    def __init__(self) -> None:
        super().__init__()
        position = torch.arange(_SEQ_LEN, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, _DIM_MODEL, 2, dtype=torch.float32) * (-math.log(2 * _SEQ_LEN) / _DIM_MODEL))
        pe = torch.zeros(1, _SEQ_LEN, _DIM_MODEL)
        pe[0, :, 0::2] = torch.sin(position * div)
        pe[0, :, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe.expand(x.shape)


class _Transformer(nn.Module):
    """Batch norm, projection 1024 -> 200, position encoding and a 7-layer post-norm transformer encoder (8 heads,
    feed-forward 400, ReLU): ``[batch, 384, 1024]`` -> ``[batch, 384, 200]``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(_DIM_INPUT)
        self.position_encoding = _PositionEncoding()
        self.linear_proj = nn.Linear(_DIM_INPUT, _DIM_MODEL)
        layer = nn.TransformerEncoderLayer(d_model=_DIM_MODEL, nhead=_N_HEADS, dim_feedforward=2 * _DIM_MODEL,
                                           dropout=0.0, batch_first=True)
        self.transformer_encoder = nn.TransformerEncoder(layer, num_layers=_N_LAYERS, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return self.transformer_encoder(self.position_encoding(self.linear_proj(x)))


class _AttentionPool(nn.Module):
    """Attention pooling over time followed by a linear read-out: ``[batch, steps, 200]`` -> ``[batch, 1]``
    (NISQA's PoolAttFF)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(_DIM_MODEL, 2 * _DIM_MODEL)
        self.linear2 = nn.Linear(2 * _DIM_MODEL, 1)
        self.linear3 = nn.Linear(_DIM_MODEL, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.linear2(F.relu(self.linear1(x))).transpose(1, 2), dim=2)  # [batch, 1, steps]
        return self.linear3(torch.bmm(weights, x).squeeze(1))


class _QualityHead(nn.Module):
    """CNN features ``[batch, 384, 1024]`` -> normalised quality ``[batch, 1]`` in (0, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_input = nn.BatchNorm1d(_DIM_INPUT)
        self.transformer = _Transformer()
        self.norm_trans = nn.BatchNorm1d(_DIM_MODEL)
        self.pool = _AttentionPool()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.norm_input(features.transpose(1, 2)).transpose(1, 2)
        x = self.transformer(x)
        x = self.norm_trans(x.transpose(1, 2)).transpose(1, 2)
        return torch.sigmoid(self.pool(x))


class NaturalnessModel(nn.Module):
    """DistillMOS variant 7: predicted MOS of 7.68 s windows of 16 kHz audio.

    Our own implementation (the wheel's module imports torchaudio); parameter names follow the package's
    ``ConvTransformerSQAModel`` so that its state dict loads with ``strict=True``. Use it in eval mode (batch norms
    with their running statistics), as ``load_naturalness_model`` returns it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cnn = _SpectrogramCNN()
        self.transformer_pool_attn = _QualityHead()

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        """``batch``: windows ``[batch, 122880]``, float32 at 16 kHz -> MOS ``[batch]`` in (1, 5). Each window is
        peak-normalised here (as the package does), so the input's level does not matter."""
        if batch.dim() != 2 or batch.shape[1] != WINDOW:
            raise ValueError(f"expected [batch, {WINDOW}] windows, got shape {tuple(batch.shape)}")
        x = batch / (batch.abs().amax(dim=1, keepdim=True) + 1e-8)
        features = self.cnn(x).transpose(1, 2)  # [batch, 384, 1024]
        return 1 + 4 * self.transformer_pool_attn(features).squeeze(1)


def window_starts(samples: int) -> list[int]:
    """Where the package's windows start in a clip of ``samples`` at 16 kHz: ``[0]`` for a clip up to 7.68 s (it is
    zero-padded), else ``ceil((samples - 122880) / 16000) + 1`` starts evenly spread from its start to its end (hops
    of at most 1 s)."""
    over = samples - WINDOW
    if over <= 0:
        return [0]
    n = math.ceil(over / MAX_HOP) + 1
    return [int(c * over) for c in np.linspace(0, 1, n)]  # the package's float64 positions, truncated


def windows(wav16: torch.Tensor, starts: list[int] | None = None) -> torch.Tensor:
    """Cut ``[samples]`` at 16 kHz into windows ``[n, 122880]`` at ``starts`` (default: all of
    ``window_starts``), zero-padding the clip to at least one window."""
    if wav16.shape[0] < WINDOW:
        wav16 = F.pad(wav16, (0, WINDOW - wav16.shape[0]))
    starts = window_starts(wav16.shape[0]) if starts is None else starts
    return torch.stack([wav16[s:s + WINDOW] for s in starts])


def weights_path() -> Path:
    """Where the DistillMOS weights are: in the installed ``distillmos`` package folder, found without importing it
    (``find_spec`` of a top-level package does not run its ``__init__``). ``MissingDependencyError`` when the package
    or its weights file is absent."""
    spec = importlib.util.find_spec("distillmos")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise MissingDependencyError(f"the naturalness metric needs the DistillMOS weights from the distillmos "
                                     f"package: {INSTALL_HINT}")
    path = Path(folders[0]) / WEIGHTS_FILE
    if not path.is_file():
        raise MissingDependencyError(f"the DistillMOS weights are missing from the installed package ({path} not "
                                     f"found): reinstall it with {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=1)
def load_naturalness_model() -> NaturalnessModel:
    """The DistillMOS model with the wheel's weights, on CPU in eval mode, loaded once per process.
    ``MissingDependencyError`` without the ``distillmos`` package, ``CheckpointError`` if its weights do not fit."""
    path = weights_path()
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling errors come in many types
        raise CheckpointError(f"cannot read the DistillMOS weights {path}: {exc}") from exc
    state = checkpoint.get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a DistillMOS checkpoint (no 'model' state dict); expected the "
                              f"weights of distillmos 0.9.1 ({INSTALL_HINT})")
    model = NaturalnessModel()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"the DistillMOS weights {path} do not fit the variant-7 architecture (expected "
                              f"distillmos 0.9.1: {INSTALL_HINT}): {exc}") from exc
    return model.eval().requires_grad_(False)


def naturalness(audio: np.ndarray | torch.Tensor, sample_rate: int, *, model: NaturalnessModel | None = None) -> float:
    """Predicted MOS (1-5) of one clip. ``audio``: float ``[samples]``, or ``[channels, samples]`` /
    ``[samples, channels]`` (channels are averaged), at ``sample_rate`` Hz; it is resampled to 16 kHz.

    Raises ``AudioError`` for empty audio, NaN/inf samples or silence (peak below -80 dBFS), and
    ``MissingDependencyError`` / ``CheckpointError`` from ``load_naturalness_model``."""
    if (audio.numel() if isinstance(audio, torch.Tensor) else np.asarray(audio).size) == 0:
        raise AudioError("the audio is empty: nothing to score for naturalness")
    wav16 = torch.from_numpy(to_16k_mono(audio, sample_rate))  # AudioError for a bad shape
    if wav16.numel() == 0:  # too few samples to leave one at 16 kHz
        raise AudioError("the audio is empty: nothing to score for naturalness")
    if not bool(torch.isfinite(wav16).all()):
        raise AudioError("the audio holds NaN or infinite samples: cannot score naturalness")
    peak = float(wav16.abs().max())
    if peak < SILENCE_PEAK:
        raise AudioError(f"the audio is silent (peak {peak:.1e}, below -80 dBFS): nothing to score for naturalness")
    model = model if model is not None else load_naturalness_model()
    starts = window_starts(wav16.shape[0])
    with torch.inference_mode():  # a few windows at a time: a long clip's windows overlap, copies would not
        scores = torch.cat([model(windows(wav16, starts[i:i + WINDOWS_PER_BATCH]))
                            for i in range(0, len(starts), WINDOWS_PER_BATCH)])
    return float(scores.mean())


def naturalness_file(path: str | os.PathLike, *, model: NaturalnessModel | None = None) -> float:
    """``naturalness`` of an audio file (any format libsndfile reads; channels are averaged)."""
    return naturalness(load_16k(path), EVAL_SR, model=model)


__all__ = ["INSTALL_HINT", "NATURALNESS_NAME", "NaturalnessModel", "load_naturalness_model", "naturalness",
           "naturalness_file", "weights_path", "window_starts", "windows"]
