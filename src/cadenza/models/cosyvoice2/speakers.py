"""Saved speakers (``spk2info.pt``): a speaker id -> the prompt conditioning of a zero-shot voice.

The reference pickles a dict of zero-shot ``model_input`` dicts with ``torch.save``. We read it with
``weights_only=True`` (plain dicts of tensors and strings load; code objects are refused) and keep only the fields
we use. Entries written by the reference's ``add_zero_shot_spk`` and our own ``save`` have the same keys.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from cadenza.errors import CheckpointError, InputError, UnknownSpeakerError

_SPEAKER_ID = re.compile(r"^[\w.\- ]{1,64}$")


@dataclass
class SpeakerPrompt:
    """Everything a voice contributes to a request.

    Shapes: ``prompt_text`` [1, Tp] (LM prompt text ids, may be empty), ``llm_prompt_speech`` [1, Ps] (LM prompt
    tokens), ``flow_prompt_speech`` [1, Pf], ``prompt_mel`` [1, 2*Pf, 80], ``embedding`` [1, 192].
    """

    prompt_text: torch.Tensor
    llm_prompt_speech: torch.Tensor
    flow_prompt_speech: torch.Tensor
    prompt_mel: torch.Tensor
    embedding: torch.Tensor

    def to_entry(self) -> dict[str, torch.Tensor]:
        n_text, n_llm, n_flow = self.prompt_text.shape[1], self.llm_prompt_speech.shape[1], self.flow_prompt_speech.shape[1]
        return {
            "prompt_text": self.prompt_text.int(), "prompt_text_len": torch.tensor([n_text], dtype=torch.int32),
            "llm_prompt_speech_token": self.llm_prompt_speech.int(),
            "llm_prompt_speech_token_len": torch.tensor([n_llm], dtype=torch.int32),
            "flow_prompt_speech_token": self.flow_prompt_speech.int(),
            "flow_prompt_speech_token_len": torch.tensor([n_flow], dtype=torch.int32),
            "prompt_speech_feat": self.prompt_mel.float(),
            "prompt_speech_feat_len": torch.tensor([self.prompt_mel.shape[1]], dtype=torch.int32),
            "llm_embedding": self.embedding.float(), "flow_embedding": self.embedding.float(),
        }


def validate_speaker_id(speaker_id: str) -> str:
    if not isinstance(speaker_id, str) or not _SPEAKER_ID.match(speaker_id):
        raise InputError(f"invalid speaker id {speaker_id!r}: use 1-64 letters, digits, spaces, '.', '_' or '-'")
    return speaker_id


def entry_to_prompt(speaker_id: str, entry: dict) -> SpeakerPrompt:
    empty = torch.zeros(1, 0, dtype=torch.long)
    try:
        if "flow_embedding" in entry:  # zero-shot entry (add_zero_shot_spk)
            return SpeakerPrompt(
                prompt_text=entry.get("prompt_text", empty).long().reshape(1, -1),
                llm_prompt_speech=entry.get("llm_prompt_speech_token", empty).long().reshape(1, -1),
                flow_prompt_speech=entry["flow_prompt_speech_token"].long().reshape(1, -1),
                prompt_mel=entry["prompt_speech_feat"].float().reshape(1, -1, entry["prompt_speech_feat"].shape[-1]),
                embedding=entry["flow_embedding"].float().reshape(1, -1),
            )
        # sft entry (CosyVoice 1 style): an embedding only
        return SpeakerPrompt(empty, empty, empty, torch.zeros(1, 0, 80), entry["embedding"].float().reshape(1, -1))
    except (KeyError, AttributeError, RuntimeError) as exc:
        raise CheckpointError(f"spk2info entry {speaker_id!r} is malformed: {exc!r}") from exc


class SpeakerStore:
    """Speakers from ``spk2info.pt`` (optional; empty when the file is absent)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._entries: dict[str, dict] = {}
        if self.path and self.path.is_file():
            try:
                data = torch.load(self.path, map_location="cpu", weights_only=True)
            except (RuntimeError, pickle.UnpicklingError, EOFError, OSError) as exc:
                raise CheckpointError(f"cannot read speakers from {self.path}: {exc}") from exc
            if not isinstance(data, dict):
                raise CheckpointError(f"{self.path} does not hold a dict of speakers")
            self._entries = {str(k): v for k, v in data.items() if isinstance(v, dict)}

    def ids(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, speaker_id: str) -> bool:
        return speaker_id in self._entries

    def get(self, speaker_id: str) -> SpeakerPrompt:
        if speaker_id not in self._entries:
            known = ", ".join(self.ids()[:20]) or "none saved"
            raise UnknownSpeakerError(f"unknown speaker {speaker_id!r} (known: {known})")
        return entry_to_prompt(speaker_id, self._entries[speaker_id])

    def add(self, speaker_id: str, prompt: SpeakerPrompt) -> None:
        self._entries[validate_speaker_id(speaker_id)] = prompt.to_entry()

    def save(self, path: str | Path | None = None) -> Path:
        target = Path(path) if path else self.path
        if target is None:
            raise InputError("no path to save speakers to")
        tmp = target.with_suffix(target.suffix + ".tmp")
        torch.save(self._entries, tmp)
        tmp.replace(target)  # atomic: a crash never leaves a half-written spk2info.pt
        return target
