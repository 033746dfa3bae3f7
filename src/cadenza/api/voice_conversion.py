"""Voice conversion's engine request: a source recording's speech tokens, read by the model's speech tokenizer or, with
what the recording says, placed by alignment (``convert_voice(source_text=)``), rendered by the flow in a target voice.

Shared by ``Cadenza.convert_voice`` and the server's ``POST /v1/audio/voice-conversion`` (``conversion_plan``).

For a model whose speech tokens are phonemes (the built-in cadenza-tiny's frame classifier), the transcript fixes the
label sequence and forced alignment places it (``cadenza.alignment.speech_labels``): on a voice the classifier never
heard its own labels are mostly wrong, the aligned ones are not (docs/cadenza-tiny.md, "Limitations"). Kept in the
API: ``models/`` does not import ``alignment/``, which sits above it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from cadenza.api.arguments import MAX_PROMPT_TEXT_CHARS, check_seed, check_text_arg
from cadenza.api.audio import PromptAudio, read_prompt_audio
from cadenza.audio.prompt import validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.engine.request import SynthesisRequest
from cadenza.errors import CheckpointError, InputError, TextError

# The speech tokenizer reads at most 30 s (as a prompt): a longer source is refused, not cut.
MAX_SOURCE_SECONDS = 30.0


class SourceAligner:
    """The model folder's phoneme frame classifier, loaded on first use, and the tokens it places."""

    def __init__(self, directory: Path, frontend) -> None:
        self.directory = directory
        self.frontend = frontend
        self._posteriors = None
        self._lock = threading.Lock()

    def _classifier(self):
        from cadenza.alignment.aligner import PhonemePosteriors

        with self._lock:
            if self._posteriors is None:
                if not self.frontend.reads_phonemes:
                    raise TextError("a transcript of the source audio needs a model whose speech tokens are phonemes "
                                    "(such as the built-in cadenza-tiny); leave it out for this model")
                try:
                    self._posteriors = PhonemePosteriors(self.directory)
                except (ValueError, CheckpointError) as exc:
                    raise TextError(f"this model's speech tokenizer cannot use a transcript ({exc}); leave it out") \
                        from None
            return self._posteriors

    def tokens(self, wav16k: torch.Tensor, transcript: str) -> torch.Tensor:
        """wav ``[N]`` at 16 kHz and what it says -> speech token ids ``[1, T]``, as many as the tokenizer gives."""
        from cadenza.alignment.speech_labels import aligned_labels

        posteriors = self._classifier()
        ids = self.frontend.text_ids(transcript, "source text")[0].tolist()
        frames = self.frontend.speech_tokens(wav16k).shape[1]  # the tokenizer's count (the output's length)
        labels = torch.from_numpy(aligned_labels(posteriors(wav16k.numpy()), ids, posteriors.symbols))
        if labels.numel() < frames:  # the classifier's frame count can differ by one at the end
            labels = torch.cat([labels, labels[-1:].repeat(frames - labels.numel())])
        return labels[:frames].reshape(1, -1)


def conversion_request(frontend, aligner: SourceAligner, source: PromptAudio, target, *, source_text: str | None = None,
                       seed: int | None = None, sample_rate: int, max_seconds: float = MAX_SOURCE_SECONDS,
                       ) -> SynthesisRequest:
    """The engine request that says what ``source`` says in the voice of ``target`` (a ``SpeakerPrompt``: its flow
    prompt). ``source``: a path, encoded bytes or ``(samples, rate)`` at any rate, at most ``max_seconds`` long;
    ``source_text``: what it says (phoneme models only, see ``SourceAligner``). Raises ``InputError``/``AudioError``/
    ``TextError`` for bad arguments before any model work."""
    check_seed(seed)
    check_text_arg(source_text, "source_text", optional=True, max_chars=MAX_PROMPT_TEXT_CHARS)  # a transcript's bounds
    wav, sr = read_prompt_audio(source, sample_rate)
    validate_prompt_audio(wav, sr, max_seconds=min(max_seconds, MAX_SOURCE_SECONDS))
    wav16k = resample(wav, sr, 16000)
    tokens = frontend.speech_tokens(wav16k) if source_text is None else aligner.tokens(wav16k, source_text)
    return SynthesisRequest(mode="vc", voice=target, source_tokens=tokens, seed=seed)


def convert_voice_request(tts, source: PromptAudio, prompt_wav: PromptAudio | None, *, speaker: str | None,
                          source_text: str | None, seed: int | None) -> SynthesisRequest:
    """``Cadenza.convert_voice``'s request: the target is ``prompt_wav``'s voice, the saved ``speaker``'s, or with
    neither the model's default voice; the cheap refusals come before any audio is read."""
    check_seed(seed)
    check_text_arg(source_text, "source_text", optional=True, max_chars=MAX_PROMPT_TEXT_CHARS)
    if prompt_wav is not None and speaker is not None:
        raise InputError("give either prompt_wav or speaker as the target voice, not both")
    if speaker is None and prompt_wav is None and tts.default_speaker is None:
        raise InputError("this model has no default voice: give prompt_wav or speaker as the target voice")
    if prompt_wav is None:  # a saved voice (checked before any audio is read): its flow prompt is the target
        target = tts._voice(None, None, None, None, speaker)[0]
    else:
        target = tts.voice_from_audio(prompt_wav)
    return conversion_request(tts.engine.frontend, tts.source_aligner, source, target, source_text=source_text,
                              seed=seed, sample_rate=tts.sample_rate)
