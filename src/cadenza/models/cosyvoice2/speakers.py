"""Saved speakers (``spk2info.pt``): a speaker id -> the prompt conditioning of a zero-shot voice.

The reference pickles a dict of zero-shot ``model_input`` dicts with ``torch.save``. We read it with
``weights_only=True`` (plain dicts of tensors and strings load; code objects are refused) and keep only the fields
we use. Entries written by the reference's ``add_zero_shot_spk`` and our own ``save`` have the same keys.
``SpeakerStore.verify`` checks every entry against the model at load (dtypes, shapes, id ranges, finite values), so
a saved speaker can never fail a request later with an error that blames the client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from cadenza.errors import CheckpointError, InputError, UnknownSpeakerError
from cadenza.loading.files import check_file
from cadenza.models.cosyvoice2.config import CosyVoice2Config

_SPEAKER_ID = re.compile(r"^[\w.\- ]{1,64}$")
# Prompts come from recordings of at most 30 s (the speech tokenizer's limit; the reference asserts it).
MAX_PROMPT_SECONDS = 30


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
        raise InputError(f"invalid speaker id {str(speaker_id)[:80]!r}: use 1-64 letters, digits, spaces, '.', '_' or '-'")
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
    except (KeyError, AttributeError, RuntimeError, IndexError, TypeError) as exc:
        raise CheckpointError(f"spk2info entry {speaker_id!r} is malformed: {exc!r}") from exc


_ID_FIELDS = ("prompt_text", "llm_prompt_speech_token", "flow_prompt_speech_token")
_FLOAT_FIELDS = ("prompt_speech_feat", "flow_embedding", "llm_embedding", "embedding")


def _check_entry(speaker_id: str, entry: dict, config: CosyVoice2Config) -> None:
    """Raise ``CheckpointError`` unless ``entry`` gives a prompt the model can use (see ``SpeakerStore.verify``)."""

    def bad(msg: str) -> CheckpointError:
        return CheckpointError(f"speaker {speaker_id!r}: {msg}")

    for name in (*_ID_FIELDS, *_FLOAT_FIELDS):
        t = entry.get(name)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise bad(f"{name} is a {type(t).__name__}, not a tensor")
        if name in _ID_FIELDS and (t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool):
            raise bad(f"{name} must hold integer ids, not {t.dtype}")
        if name in _FLOAT_FIELDS and (not t.dtype.is_floating_point or not bool(torch.isfinite(t).all())):
            raise bad(f"{name} must be finite floats ({t.dtype})")
    if "flow_embedding" not in entry and "embedding" not in entry:
        raise bad("has neither flow_embedding (zero-shot entry) nor embedding (sft entry)")
    if "flow_embedding" in entry and "flow_prompt_speech_token" not in entry:
        raise bad("has flow_embedding but no flow_prompt_speech_token")
    if "flow_embedding" in entry and "prompt_speech_feat" not in entry:
        raise bad("has flow_embedding but no prompt_speech_feat")
    prompt = entry_to_prompt(speaker_id, entry)
    lm, flow = config.lm, config.flow
    if prompt.embedding.shape[1] != flow.spk_embed_dim:
        raise bad(f"the embedding has {prompt.embedding.shape[1]} values; the model needs {flow.spk_embed_dim}")
    if prompt.prompt_mel.shape[1] and prompt.prompt_mel.shape[2] != flow.output_size:
        raise bad(f"prompt_speech_feat has {prompt.prompt_mel.shape[2]} mel bins; the model needs {flow.output_size}")
    limit = MAX_PROMPT_SECONDS * config.token_frame_rate
    for name, ids, size in (("prompt_text", prompt.prompt_text, lm.qwen.vocab_size),
                            ("llm_prompt_speech_token", prompt.llm_prompt_speech, lm.speech_token_size),
                            ("flow_prompt_speech_token", prompt.flow_prompt_speech, lm.speech_token_size)):
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise bad(f"{name} has ids outside [0, {size})")
        if name != "prompt_text" and ids.shape[1] > limit:
            raise bad(f"{name} has {ids.shape[1]} tokens; a prompt has at most {limit} ({MAX_PROMPT_SECONDS} s)")
    frames, tokens = prompt.prompt_mel.shape[1], prompt.flow_prompt_speech.shape[1]
    if frames > config.token_mel_ratio * tokens:  # the flow places the prompt mel over the prompt tokens' frames
        raise bad(f"prompt_speech_feat has {frames} frames but flow_prompt_speech_token only {tokens} tokens "
                  f"(at most {config.token_mel_ratio} frames per token)")


class SpeakerStore:
    """Speakers from ``spk2info.pt`` (optional; empty when the file is absent)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._entries: dict[str, dict] = {}
        if self.path and (self.path.exists() or self.path.is_symlink()):
            check_file(self.path, "spk2info.pt")
            try:
                data = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any failure of torch's reader on a user file means a bad file
                raise CheckpointError(f"cannot read speakers from {self.path} (corrupt, truncated, or a pickle that "
                                      f"would run code): {type(exc).__name__}: {exc}") from exc
            if not isinstance(data, dict):
                raise CheckpointError(f"{self.path} does not hold a dict of speakers (found {type(data).__name__})")
            for key, value in data.items():
                if not isinstance(key, str) or not isinstance(value, dict):
                    raise CheckpointError(f"{self.path}: speaker {key!r} must be a string id with a dict entry, "
                                          f"found {type(key).__name__} -> {type(value).__name__}")
            self._entries = dict(data)

    def verify(self, config: CosyVoice2Config) -> None:
        """Check every saved speaker against the model's ``CosyVoice2Config``: integer ids inside the text and
        speech vocabularies, finite float features, the embedding size, the mel bins, at most 30 s of prompt,
        and no more prompt mel frames than the prompt tokens cover. Raises ``CheckpointError`` naming the file and
        the speaker."""
        for speaker_id, entry in self._entries.items():
            try:
                _check_entry(speaker_id, entry, config)
            except CheckpointError as exc:
                raise CheckpointError(f"{self.path or 'spk2info.pt'}: {exc}") from exc

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
