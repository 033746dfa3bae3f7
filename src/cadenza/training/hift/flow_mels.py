"""The flow's own mels of a corpus, for fine-tuning a vocoder on what it will be given (``hift.input_mel: flow``).

A vocoder trained on mels computed from real audio meets something else at inference: the flow's output, smoother
than a real mel and off in its fine detail. Fine-tuning it on mels the acoustic model generates for the training
audio, with that audio as the target, teaches it to render those (Tacotron 2's "ground-truth-aligned" mels; the
HiFi-GAN paper's fine-tuning). Here the flow is run over each utterance's stored speech tokens — for cadenza-tiny
the teacher's own phoneme timings, so the generated frames line up with the audio (2 mel frames per 25 Hz token,
boundaries to within half a token) — prompted by a saved voice of the model, as ``cadenza synth`` prompts it.

    cadenza data extract --data DATA --extractor cadenza.training.hift.flow_mels:flow_mel_extractor=MODEL_DIR[,VOICE]

``VOICE``: the saved voice (default: the model's default speaker, ``cadenza.json``, else its first saved voice).
Stores ``flow_mel`` float32 ``[frames, n_mels]`` with ``frames = samples // hop`` of the stored 24 kHz waveform
(the last frame repeated or the extra cut, like ``mel``). Needs ``speech_tokens`` stored first. A single-speaker
corpus is the case it is for: every utterance is rendered in the one saved voice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cadenza.data.extractors import Utterance
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.loader import inspect_directory
from cadenza.models.cosyvoice2.speakers import SpeakerStore
from cadenza.training.hift.data import fit_frames
from cadenza.training.init_weights import load_component


class FlowMelExtractor:
    """Per utterance: its stored ``speech_tokens [T]`` -> the model's flow mel, non-streaming, the model's own
    guidance and Euler steps -> ``flow_mel [samples // hop, n_mels]``."""

    name = "flow_mel"
    fields = ("flow_mel",)
    needs = ("speech_tokens",)

    def __init__(self, model_dir: str | Path, voice: str | None = None) -> None:
        files = inspect_directory(model_dir)
        config = CosyVoice2Config.from_files(files.config, files.qwen_config)
        self.flow = TokenToMelFlow(config.flow).eval()  # the flow alone: the LM and the vocoder are not needed
        load_component(self.flow, files.directory, "flow.pt")
        self.hop = config.mel.hop_size  # samples per mel frame at the model's rate
        self.sample_rate = config.sample_rate
        speakers = SpeakerStore(files.spk2info)
        voice = voice or self._default_voice(Path(model_dir), speakers)
        if voice not in speakers:
            raise InputError(f"{model_dir} has no saved voice {voice!r} (it has: {', '.join(speakers.ids()) or 'none'})")
        self.voice = speakers.get(voice)

    @staticmethod
    def _default_voice(model_dir: Path, speakers: SpeakerStore) -> str:
        meta = model_dir / "cadenza.json"
        if meta.is_file():
            name = json.loads(meta.read_text(encoding="utf-8")).get("default_speaker")
            if name:
                return str(name)
        names = speakers.ids()
        if not names:
            raise InputError(f"{model_dir} has no saved voice to prompt the flow with (spk2info.pt)")
        return names[0]

    @torch.inference_mode()
    def __call__(self, utt: Utterance) -> dict[str, Any]:
        tokens = utt.stored["speech_tokens"].long().reshape(1, -1)
        frames = utt.audio_at(self.sample_rate).numel() // self.hop
        mel = self.flow.inference(tokens, self.voice.flow_prompt_speech, self.voice.prompt_mel, self.voice.embedding,
                                  streaming=False, finalize=True)[0].float().T  # [2 T, n_mels]
        return {"flow_mel": fit_frames(mel, frames)}


def flow_mel_extractor(spec: str) -> FlowMelExtractor:
    """``MODEL_DIR`` or ``MODEL_DIR,VOICE`` (the command line's ``=ARG``)."""
    model_dir, _, voice = spec.partition(",")
    return FlowMelExtractor(model_dir, voice or None)
