"""Utterance sources of the component stages (tokenizer, speaker encoder, HiFT): audio + transcript + speaker.

Two layouts, chosen by the stage's ``data_format`` (``auto`` picks whichever index file ``DATA_DIR`` holds):

* ``shards``: a corpus prepared by ``cadenza data prepare`` (``index.jsonl`` + safetensors shards, see
  ``cadenza.data``); the stages use its 24 kHz ``wav`` (and ``f0`` when stored), ``text`` and ``speaker``.
* ``manifest``: a plain folder, for quick experiments::

      DATA_DIR/manifest.jsonl   one JSON object per line:
                                {"audio": "wavs/0001.wav", "text": "transcript", "speaker": "spk07", "id": "0001"}
      DATA_DIR/wavs/...         the audio (any rate, any channels, any format libsndfile reads)

  ``audio`` is relative to DATA_DIR (or absolute); ``text`` is needed by the tokenizer stage, ``speaker`` by the
  speaker stage; ``id`` defaults to the line number.

Stages read data only through :func:`open_utterances`; another layout is one more class with ``__len__``,
``meta(i)`` and ``load(i, sample_rate)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from cadenza.audio.io import load_audio
from cadenza.audio.resample import resample
from cadenza.errors import InputError

MANIFEST_NAME = "manifest.jsonl"
SHARD_INDEX_NAME = "index.jsonl"  # cadenza.data.shards.INDEX_FILE (not imported: keeps cadenza.data lazy)
FORMATS = ("auto", "shards", "manifest")


@dataclass(frozen=True)
class UtteranceMeta:
    """What a stage may need besides the audio. ``text`` / ``speaker`` are None when the source lacks them."""

    id: str
    text: str | None
    speaker: str | None


class UtteranceSource(Protocol):
    def __len__(self) -> int: ...

    def meta(self, index: int) -> UtteranceMeta: ...

    def load(self, index: int, sample_rate: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mono float32 ``wav [samples]`` in [-1, 1] at ``sample_rate``, and the stored f0 track (Hz per 50 Hz mel
        frame, frame t centred on sample ``t * 480 + 240`` at 24 kHz) or None."""
        ...


def _none_if_empty(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def manifest_rows(path: Path, needs: str, text: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSON-lines manifest; ``InputError`` naming the line when it
    is not JSON or lacks a string ``audio`` (and ``text``, with ``text=True``); ``needs`` says what a line needs."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{n}: not valid JSON ({exc})") from exc
        if (not isinstance(row, dict) or not isinstance(row.get("audio"), str)
                or (text and not isinstance(row.get("text"), str))):
            raise InputError(f"{path}:{n}: {needs}")
        yield n, row


class ManifestSource:
    """The ``manifest.jsonl`` layout (module docstring). Has no stored f0."""

    def __init__(self, data_dir: str | Path, manifest: str = MANIFEST_NAME) -> None:
        self.data_dir = Path(data_dir)
        path = self.data_dir / manifest
        if not path.is_file():
            raise InputError(f"training data manifest not found: {path} (one JSON object per line with 'audio', "
                             "'text', 'speaker')")
        self._audio: list[Path] = []
        self._meta: list[UtteranceMeta] = []
        for n, row in manifest_rows(path, "each line needs an 'audio' path"):
            audio = Path(row["audio"])
            self._audio.append(audio if audio.is_absolute() else self.data_dir / audio)
            self._meta.append(UtteranceMeta(id=str(row.get("id", n)), text=_none_if_empty(row.get("text")),
                                            speaker=_none_if_empty(row.get("speaker"))))
        if not self._meta:
            raise InputError(f"{path} lists no utterances")
        self._check_readable(path)

    def _check_readable(self, path: Path) -> None:
        """Refuse now a manifest whose audio cannot be read (a missing or undecodable file stopped the run when the
        sampler reached it, with the work since the last checkpoint lost, and again on resume): each file's header
        (libsndfile), or a decode where only FFmpeg reads it (m4a, WebM)."""
        import soundfile as sf

        from cadenza.audio.io import decode_audio
        from cadenza.errors import AudioError

        bad = []
        for audio in self._audio:
            try:
                sf.info(str(audio))
            except (sf.LibsndfileError, RuntimeError, OSError, ValueError):
                try:
                    decode_audio(audio, None)
                except AudioError as exc:
                    bad.append(str(exc))
        if bad:
            raise InputError(f"{path}: {len(bad)} of {len(self._audio)} audio files cannot be read ("
                             f"{'; '.join(b[:160] for b in bad[:3])}{' ...' if len(bad) > 3 else ''}): fix or drop "
                             "those lines (`cadenza data prepare` checks each clip and lists the rejected ones)")

    def __len__(self) -> int:
        return len(self._meta)

    def meta(self, index: int) -> UtteranceMeta:
        return self._meta[index]

    def load(self, index: int, sample_rate: int) -> tuple[torch.Tensor, None]:
        return load_audio(self._audio[index], sample_rate, max_bytes=None), None


class ShardSource:
    """A prepared corpus (``cadenza.data``): its ``wav`` field (int16 at ``sample_rate``) and optional ``f0``;
    ``required`` names more fields an item must have (others are skipped), read with ``stored``."""

    def __init__(self, data_dir: str | Path, sample_rate: int = 24000, required: tuple[str, ...] = ()) -> None:
        from cadenza.data.dataset import ShardDataset  # training-only package, imported when used

        self.dataset = ShardDataset(data_dir, fields=("wav", *required), optional=("f0",))
        self.sample_rate = sample_rate

    def __len__(self) -> int:
        return len(self.dataset)

    def meta(self, index: int) -> UtteranceMeta:
        e = self.dataset.entries[index]
        return UtteranceMeta(id=str(e["id"]), text=_none_if_empty(e.get("text")),
                             speaker=_none_if_empty(e.get("speaker")))

    def load(self, index: int, sample_rate: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        item = self.dataset[index]
        f0 = item.get("f0")
        return resample(item["wav"], self.sample_rate, sample_rate), None if f0 is None else f0.float()

    def stored(self, index: int, name: str) -> torch.Tensor:
        """Item ``index``'s stored field ``name`` (one of ``required``), as stored; reads that field only."""
        return self.dataset.field(index, name)


def open_utterances(data_dir: str | Path, data_format: str = "auto", manifest: str = MANIFEST_NAME,
                    shard_sample_rate: int = 24000, required: tuple[str, ...] = ()) -> UtteranceSource:
    """The utterance source of ``data_dir``. ``data_format``: ``auto`` (shards if ``index.jsonl`` exists, else the
    manifest), ``shards`` or ``manifest``; ``manifest`` names the manifest file; ``shard_sample_rate`` is the rate of
    the shards' ``wav`` (the preparation's ``DataLimits.sample_rate``); ``required``: stored fields every item must
    have (a prepared corpus only)."""
    if data_format not in FORMATS:
        raise InputError(f"unknown data format {data_format!r}; supported: {', '.join(FORMATS)}")
    d = Path(data_dir)
    if data_format == "shards" or (data_format == "auto" and (d / SHARD_INDEX_NAME).is_file()):
        return ShardSource(d, shard_sample_rate, required)
    if required:
        raise InputError(f"{d}: the stored fields {', '.join(required)} need a prepared corpus (`cadenza data "
                         "prepare`, then `cadenza data extract`), not a manifest folder")
    if data_format == "auto" and not (d / manifest).is_file():
        raise InputError(f"{d} holds neither a prepared corpus ({SHARD_INDEX_NAME}) nor a {manifest}")
    return ManifestSource(d, manifest)


def heldout_split(count: int, fraction: float, seed: int, groups: list[str] | None = None
                  ) -> tuple[list[int], list[int]]:
    """Deterministic split of ``range(count)`` into (train, held-out) indices.

    With ``groups`` (e.g. speaker ids) the split is made within every group, and a group keeps at least one
    training item. ``fraction`` 0 gives an empty held-out set.
    """
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"held-out fraction must be in [0, 1), got {fraction}")
    generator = torch.Generator().manual_seed(seed)
    keys = groups if groups is not None else [""] * count
    by_group: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_group.setdefault(key, []).append(i)
    heldout: list[int] = []
    for key in sorted(by_group):
        members = by_group[key]
        n_out = min(int(round(fraction * len(members))), len(members) - 1)
        order = torch.randperm(len(members), generator=generator).tolist()
        heldout += [members[j] for j in order[:n_out]]
    held = set(heldout)
    return [i for i in range(count) if i not in held], sorted(held)


class SourceItems(torch.utils.data.Dataset):
    """``indices`` of a source as a dataset of whole utterances: ``{"index": i, "wav": [samples], "f0": [frames] or
    None}`` at ``sample_rate`` (``index`` is the dataset position, the key of the per-item random streams)."""

    def __init__(self, source: UtteranceSource, indices: list[int], sample_rate: int) -> None:
        self.source, self.indices, self.sample_rate = source, list(indices), sample_rate

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        wav, f0 = self.source.load(self.indices[i], self.sample_rate)
        return {"index": i, "wav": wav, "f0": f0}
