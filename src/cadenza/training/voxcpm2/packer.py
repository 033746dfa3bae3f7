"""Training sequences for VoxCPM 2 (the reference's ``AudioFeatureProcessingPacker``).

See docs/design.md, "VoxCPM 2 training".

Each sample's audio is right-padded to a multiple of ``patch_size · hop`` samples, encoded by the frozen AudioVAE
and grouped into patches; the sequence layout is

| case | text ids | loss on |
| --- | --- | --- |
| plain | ``X, 101, 0×A, 102`` | the A target patches |
| ``is_prompt`` | ``X, 103, 0×A, 104`` | nothing (prompt-style sample) |
| with reference audio | ``103, 0×R, 104, X, 101, 0×A, 102`` | the A target patches (``is_prompt`` is ignored) |

Audio positions carry text id 0 and their patch; text positions an all-zero patch. The stop label is 1 at the last
target patch. The batch is right-padded with zeros to the longest sample (capped at ``max_len``; longer samples are
truncated). Bookkeeping as the reference: per-dataset audio seconds and text-token counts (float sums truncated to
integers), ``audio_task_ids`` (1 = tts at audio positions) and ``audio_dataset_ids`` (dataset id + 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cadenza.errors import InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.config import SpecialTokens
from cadenza.models.voxcpm2.layouts import latents_to_patches

TTS_TASK_ID = 1
PAD_VALUE = -100  # the reference's padding marker in its padded text / audio tensors


@dataclass(frozen=True)
class TrainingSample:
    """One utterance: text ids (no BOS/EOS), target audio ``[n]`` at the VAE rate, optional reference audio."""

    text_ids: Sequence[int]
    audio: torch.Tensor
    ref_audio: torch.Tensor | None = None
    is_prompt: bool = False
    dataset_id: int = 0

    def __post_init__(self) -> None:
        if len(self.text_ids) == 0:
            raise InputError("a training sample needs text ids")
        if self.audio.dim() != 1 or self.audio.numel() == 0:
            raise InputError(f"training audio must be a non-empty mono [n] tensor, got {tuple(self.audio.shape)}")
        if self.ref_audio is not None and (self.ref_audio.dim() != 1 or self.ref_audio.numel() == 0):
            raise InputError("reference audio must be a non-empty mono [n] tensor (or None)")
        if self.dataset_id < 0:
            raise InputError(f"dataset_id must be >= 0, got {self.dataset_id}")


@dataclass(frozen=True)
class EncodedSample:
    """A ``TrainingSample`` whose audio is already encoded: ``patches`` ``[A, P, D]``, ``ref_patches`` ``[R, P, D]``
    or None (float32, as ``VoxCPM2Packer.encode`` returns them)."""

    text_ids: Sequence[int]
    patches: torch.Tensor
    ref_patches: torch.Tensor | None = None
    is_prompt: bool = False
    dataset_id: int = 0


@dataclass
class PackedBatch:
    """``[B, T]`` int32 tracks (``position_ids`` int64), ``audio_feats`` ``[B, T, P, D]`` float32, and per-dataset
    ``audio_duration_consumed`` / ``text_token_consumed`` ``[K]`` int64."""

    text_tokens: torch.Tensor
    audio_feats: torch.Tensor
    text_mask: torch.Tensor
    audio_mask: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    audio_task_ids: torch.Tensor
    audio_dataset_ids: torch.Tensor
    audio_duration_consumed: torch.Tensor
    text_token_consumed: torch.Tensor


def _ints(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32)


class VoxCPM2Packer:
    """``packer(samples) -> PackedBatch``. The AudioVAE is used frozen (no gradients)."""

    def __init__(self, vae: AudioVAE | None, patch_size: int, feat_dim: int, max_len: int = 8192,
                 dataset_count: int = 1, special: SpecialTokens | None = None,
                 frames_per_second: float | None = None) -> None:
        """``vae`` None: only ``pack`` works (patches encoded beforehand); give ``frames_per_second`` (VAE sample
        rate / hop) then, for the audio-seconds bookkeeping."""
        if patch_size < 1 or max_len < 1:
            raise InputError("patch_size and max_len must be positive")
        if vae is not None and vae.latent_dim != feat_dim:
            raise InputError(f"AudioVAE latent dim {vae.latent_dim} != feat_dim {feat_dim}")
        if vae is None and not (frames_per_second and frames_per_second > 0):
            raise InputError("a packer without an AudioVAE needs frames_per_second")
        self.vae, self.patch_size, self.feat_dim, self.max_len = vae, patch_size, feat_dim, max_len
        self.dataset_count = max(dataset_count, 1)
        self.special = special or SpecialTokens()
        self.frames_per_second = frames_per_second or vae.sample_rate / vae.hop_length

    @staticmethod
    def from_padded(audio: torch.Tensor, text: torch.Tensor, dataset_ids: torch.Tensor, is_prompts: Sequence[bool],
                    ref_audio: torch.Tensor | None = None) -> list[TrainingSample]:
        """Samples from the reference's padded tensors (``-100`` marks the padding; an all-padding reference row
        means no reference)."""

        def unpad(row: torch.Tensor) -> torch.Tensor:
            pads = (row == PAD_VALUE).nonzero(as_tuple=True)[0]
            return row if pads.numel() == 0 else row[: int(pads[0])]

        samples = []
        for i in range(audio.shape[0]):
            ref = unpad(ref_audio[i]).float() if ref_audio is not None else None
            samples.append(TrainingSample(
                text_ids=unpad(text[i]).tolist(), audio=unpad(audio[i]).float(),
                ref_audio=ref if ref is not None and ref.numel() > 0 else None,
                is_prompt=bool(is_prompts[i]), dataset_id=int(dataset_ids[i]),
            ))
        return samples

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """``[n]`` -> patches ``[k, P, D]`` (right-padded to whole patches, as the reference)."""
        if self.vae is None:
            raise InputError("this packer has no AudioVAE: it packs encoded samples only (pack)")
        wav = F.pad(wav.float(), (0, -wav.numel() % (self.patch_size * self.vae.hop_length)))
        return latents_to_patches(self.vae.encode(wav[None], self.vae.sample_rate).float().cpu(), self.patch_size)

    def encoded(self, s: TrainingSample) -> EncodedSample:
        """``s`` with its audio encoded to patches (the fine-tuning stage caches these)."""
        return EncodedSample(s.text_ids, self.encode(s.audio), None if s.ref_audio is None else self.encode(s.ref_audio),
                             s.is_prompt, s.dataset_id)

    def _sample(self, s: EncodedSample) -> tuple[dict[str, torch.Tensor], float, int]:
        """One sample's tracks (unpadded), its audio seconds and its text-token count."""
        sp, p, d = self.special, self.patch_size, self.feat_dim
        text = _ints(s.text_ids)
        target = s.patches
        a = target.shape[0]
        seconds = a * p / self.frames_per_second

        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(n, p, d)

        if s.ref_patches is not None:
            ref = s.ref_patches
            r = ref.shape[0]
            seconds += r * p / self.frames_per_second
            ids = torch.cat([_ints([sp.ref_audio_start]), torch.zeros(r, dtype=torch.int32), _ints([sp.ref_audio_end]),
                             text, _ints([sp.audio_start]), torch.zeros(a, dtype=torch.int32), _ints([sp.audio_end])])
            feats = torch.cat([zeros(1), ref, zeros(1), zeros(len(text)), zeros(1), target, zeros(1)])
            audio_mask = _ints([0] + [1] * r + [0] * (len(text) + 2) + [1] * a + [0])
            loss_mask = _ints([0] * (r + len(text) + 3) + [1] * a + [0])
        else:
            start, end = (sp.ref_audio_start, sp.ref_audio_end) if s.is_prompt else (sp.audio_start, sp.audio_end)
            ids = torch.cat([text, _ints([start]), torch.zeros(a, dtype=torch.int32), _ints([end])])
            feats = torch.cat([zeros(len(text) + 1), target, zeros(1)])
            audio_mask = _ints([0] * (len(text) + 1) + [1] * a + [0])
            loss_mask = audio_mask * (0 if s.is_prompt else 1)
        labels = torch.zeros(ids.shape[0], dtype=torch.int32)
        labels[-2] = 1  # stop at the last target patch
        tracks = {
            "text_tokens": ids, "audio_feats": feats, "text_mask": 1 - audio_mask, "audio_mask": audio_mask,
            "loss_mask": loss_mask, "labels": labels, "audio_task_ids": audio_mask * TTS_TASK_ID,
            "audio_dataset_ids": audio_mask * (s.dataset_id + 1),
        }
        return tracks, seconds, len(text)

    def __call__(self, samples: Sequence[TrainingSample]) -> PackedBatch:
        return self.pack([self.encoded(s) for s in samples])

    def pack(self, samples: Sequence[EncodedSample]) -> PackedBatch:
        """Already encoded samples -> the padded batch (no AudioVAE needed)."""
        if not samples:
            raise InputError("cannot pack an empty batch")
        for s in samples:
            for what, x in (("target", s.patches), ("reference", s.ref_patches)):
                if x is not None and tuple(x.shape[1:]) != (self.patch_size, self.feat_dim):
                    raise InputError(f"{what} patches must be [k, {self.patch_size}, {self.feat_dim}], "
                                     f"got {tuple(x.shape)}")
        k = max(self.dataset_count, max(s.dataset_id for s in samples) + 1)
        seconds = torch.zeros(k, dtype=torch.float32)
        tokens = torch.zeros(k, dtype=torch.float32)
        rows = []
        for s in samples:
            tracks, secs, n_text = self._sample(s)
            seconds[s.dataset_id] += secs
            tokens[s.dataset_id] += n_text
            rows.append(tracks)
        lengths = [r["text_tokens"].shape[0] for r in rows]
        t = min(self.max_len, max(lengths))

        def fit(x: torch.Tensor) -> torch.Tensor:  # truncate or zero-pad along dim 0
            return x[:t] if x.shape[0] >= t else torch.cat([x, x.new_zeros(t - x.shape[0], *x.shape[1:])])

        batch = {name: torch.stack([fit(r[name]) for r in rows]) for name in rows[0]}
        batch["position_ids"] = torch.stack([fit(torch.arange(min(n, t))) for n in lengths])
        return PackedBatch(**batch, audio_duration_consumed=seconds.long(), text_token_consumed=tokens.long())
