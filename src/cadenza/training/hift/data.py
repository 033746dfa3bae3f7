"""HiFT training data (the reference's ``data_pipeline_gan``): whole utterances with an f0 track, cut into random
fixed-length crops in ``train_step`` (per-item random streams, see ``cadenza.training.seeding``).

Crops start on a mel-frame boundary so that the utterance's f0 track (stored by ``cadenza data prepare``, or
computed here with YIN) slices exactly onto the crop's frames; the reference starts anywhere and re-runs pyworld on
the crop. Audio shorter than a crop is zero-padded (f0 0 = unvoiced there), as in the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cadenza.audio.pitch import fill_f0_gaps, yin_f0
from cadenza.audio.resample import resample
from cadenza.training.seeding import item_generator
from cadenza.training.wav_manifest import SourceItems, UtteranceSource

SALT_CROP = 11


def fit_frames(mel: torch.Tensor, frames: int) -> torch.Tensor:
    """``mel [F, n_mels]`` -> ``[frames, n_mels]``: the last frame repeated, or the extra cut (as ``mel`` is cut to
    ``samples // hop``)."""
    return torch.cat([mel, mel[-1:].expand(max(0, frames - mel.shape[0]), -1)])[:frames].contiguous()


class HiFTUtterances(SourceItems):
    """Item: ``{"index": i, "wav": [samples], "f0": [samples // hop]}`` at ``sample_rate``; the stored f0 is used
    when it has the right length (unless ``track="yin"``), otherwise YIN runs here (in the DataLoader worker) with
    ``voicing_threshold``; then unvoiced gaps of at most ``fill_gaps`` frames inside voiced stretches are filled.
    ``input_mel``: a stored field (``flow_mel``, ``[frames, n_mels]``) that becomes the item's ``"mel"``
    ``[n_mels, samples // hop]``, the generator's input instead of the crop's own mel (``hift.input_mel: flow``)."""

    def __init__(self, source: UtteranceSource, indices: Sequence[int], sample_rate: int, hop: int,
                 f0_range: tuple[float, float], track: str = "stored", voicing_threshold: float = 0.15,
                 fill_gaps: int = 0, input_mel: str | None = None) -> None:
        super().__init__(source, list(indices), sample_rate)
        self.hop = hop
        self.f0_range = f0_range
        self.track, self.voicing_threshold, self.fill_gaps = track, voicing_threshold, fill_gaps
        self.input_mel = input_mel

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        frames = item["wav"].shape[0] // self.hop
        f0 = item["f0"]
        if self.track == "yin" or f0 is None or abs(f0.shape[0] - frames) > 1:
            f0 = yin_f0(item["wav"], self.sample_rate, self.hop, frames, fmin=self.f0_range[0], fmax=self.f0_range[1],
                        threshold=self.voicing_threshold)
        f0 = fill_f0_gaps(f0, self.fill_gaps)
        item["f0"] = torch.nn.functional.pad(f0[:frames], (0, max(0, frames - f0.shape[0])))
        if self.input_mel is not None:
            mel = self.source.stored(self.indices[i], self.input_mel).float()
            if abs(mel.shape[0] - frames) > 2:
                raise ValueError(f"item {i}: stored {self.input_mel} has {mel.shape[0]} frames, its audio {frames}")
            item["mel"] = fit_frames(mel, frames).T.contiguous()
        return item


@dataclass
class CropBatch:
    """``speech [B, L]``, ``f0 [B, L / hop]`` and the NSF source randomness ``rand_ini [B, H]``,
    ``sine_noise [B, L, H]`` of one step (CPU tensors); ``mel [B, n_mels, L / hop]`` when the items carry a stored
    input mel (the same frames as ``f0``), else None."""

    speech: torch.Tensor
    f0: torch.Tensor
    rand_ini: torch.Tensor
    sine_noise: torch.Tensor
    mel: torch.Tensor | None = None


def _speed_perturbed(wav: torch.Tensor, track: torch.Tensor, frame: int, segment: int, hop: int,
                     rate: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The audio from ``frame`` on played ``rate`` times as fast (resampled: duration / rate, pitch and formants x
    rate; up to ``segment`` samples) and its f0 track (``[segment // hop]``, Hz x rate; 0 stays unvoiced)."""
    base = 48000  # resample() takes whole rates; 1/48000 of ratio precision, the f0 scale uses the exact one
    source_rate = round(rate * base)
    rate = source_rate / base
    span = min(wav.shape[0] - frame * hop, math.ceil(segment * rate) + hop)
    w = resample(wav[frame * hop: frame * hop + span], source_rate, base)[:segment]
    # New frame j is centred on original sample (j + 0.5) * hop * rate past the crop start: the nearest old frame.
    old = frame + torch.floor((torch.arange(segment // hop) + 0.5) * rate).long()
    t = torch.where(old < track.shape[0], track[old.clamp(max=track.shape[0] - 1)] * rate, 0.0)
    return w, t[: -(-w.shape[0] // hop)]


def crop_batch(items: Sequence[dict], segment: int, hop: int, harmonics: int, seed: int, step: int,
               speed_perturb: tuple[float, float] | None = None, speed_perturb_share: float = 0.0) -> CropBatch:
    """Random ``segment``-sample crops (starting on a multiple of ``hop``) and their source noise, each drawn from
    the item's own stream ``item_generator(seed, step, index)``.

    ``speed_perturb (low, high)``: a ``speed_perturb_share`` of the crops is cut from the audio played at a rate
    drawn log-uniformly in that range (pitch, formants and tempo together, the f0 track scaled with them); not for
    items with a stored input mel (it would no longer match the audio)."""
    frames = segment // hop
    speech, f0, rand_ini, noise, mels = [], [], [], [], []
    for item in items:
        g = item_generator(seed, step, int(item["index"]), SALT_CROP)
        wav, track = item["wav"], item["f0"]
        rate = 1.0
        if speed_perturb is not None:  # drawn only when on, so crops without it are as before
            if "mel" in item:
                raise ValueError("speed_perturb cannot be used with a stored input mel")
            perturb = float(torch.rand((), generator=g)) < speed_perturb_share
            low, high = math.log(speed_perturb[0]), math.log(speed_perturb[1])
            drawn = math.exp(low + (high - low) * float(torch.rand((), generator=g)))
            rate = drawn if perturb else 1.0
        span = math.ceil(segment * rate)
        starts = max(0, (wav.shape[0] - span) // hop)
        k = int(torch.randint(0, starts + 1, (1,), generator=g))
        if rate != 1.0:
            w, t = _speed_perturbed(wav, track, k, segment, hop, rate)
        else:
            w = wav[k * hop: k * hop + segment]
            t = track[k: k + frames]
        speech.append(torch.nn.functional.pad(w, (0, segment - w.shape[0])))
        f0.append(torch.nn.functional.pad(t, (0, frames - t.shape[0])))
        if "mel" in item:  # past the end, the quietest frame of the utterance (zero-padded audio is silence)
            m = item["mel"][:, k: k + frames]
            floor = item["mel"].min(dim=1, keepdim=True).values
            mels.append(torch.cat([m, floor.expand(-1, frames - m.shape[1])], dim=1))
        rand_ini.append(torch.rand(harmonics, generator=g))
        noise.append(torch.randn(segment, harmonics, generator=g))
    if mels and len(mels) != len(items):
        raise ValueError("some items carry an input mel and some do not")
    return CropBatch(torch.stack(speech), torch.stack(f0), torch.stack(rand_ini), torch.stack(noise),
                     torch.stack(mels) if mels else None)
