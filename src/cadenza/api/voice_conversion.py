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
from cadenza.api.live_conversion import TOKEN_SAMPLES, LiveConversion
from cadenza.audio.prompt import validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.engine.request import SynthesisRequest
from cadenza.errors import AudioError, CheckpointError, InputError, TextError

# The speech tokenizer reads at most 30 s at a time (its whisper front end): a longer source is read in windows of
# at most that, cut at the quietest 40 ms in the last 5 s of each, and the flow renders it chunk by chunk (as
# streaming does: the whole-utterance flow attends over every frame at once, too much past ~a minute).
MAX_SOURCE_SECONDS = 300.0  # the release flow's 15,000 noise frames at 50 Hz; with a voice's prompt, a little less
TOKENIZER_WINDOW_S = 30.0
SOURCE_WORDING = {"what": "source audio", "shorten": "convert it in parts"}  # its errors name it as the source
WHOLE_FLOW_TOKENS = 750  # 30 s at 25 Hz: up to this the flow renders the whole source at once, as before
TOKENS_PER_S = 16000 / TOKEN_SAMPLES
_SEARCH_S = 5.0


def tokenizer_windows(n: int, window_s: float = TOKENIZER_WINDOW_S, wav16k: torch.Tensor | None = None,
                      ) -> list[tuple[int, int]]:
    """``[start, end)`` sample bounds covering ``n`` samples at 16 kHz in windows of at most ``window_s``, each cut
    at a token boundary (a multiple of 640 samples) where ``wav16k`` is quietest in the window's last 5 s."""
    window = int(window_s * 16000) // TOKEN_SAMPLES * TOKEN_SAMPLES
    search = int(_SEARCH_S * 16000) // TOKEN_SAMPLES * TOKEN_SAMPLES
    bounds, start = [], 0
    while n - start > window:
        lo, hi = start + window - search, start + window
        cut = hi
        if wav16k is not None:
            frames = wav16k[lo:hi].reshape(-1, TOKEN_SAMPLES).pow(2).mean(dim=1)
            cut = lo + int(frames.argmin()) * TOKEN_SAMPLES  # the quietest frame opens the next window
        bounds.append((start, cut))
        start = cut
    bounds.append((start, n))
    return bounds


def windowed(read, wav16k: torch.Tensor) -> list:
    """``read`` (a tokenizer or classifier of <= 30 s) over each window of ``wav16k``."""
    return [read(wav16k[a:b]) for a, b in tokenizer_windows(wav16k.numel(), wav16k=wav16k)]


def source_tokens(frontend, wav16k: torch.Tensor) -> torch.Tensor:
    """The speech tokenizer's ids ``[1, T]`` of a source of any length (windows of at most 30 s)."""
    return torch.cat(windowed(frontend.speech_tokens, wav16k), dim=1)


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
        import numpy as np

        from cadenza.alignment.speech_labels import aligned_labels

        posteriors = self._classifier()
        ids = self.frontend.text_ids(transcript, "source text")[0].tolist()
        # As many as the speech tokenizer gives (the output's length): one per whole 40 ms, window by window and so in
        # all (the windows are cut at token boundaries); counted, not run a second time for it.
        frames = wav16k.numel() // TOKEN_SAMPLES
        probs = np.concatenate(windowed(lambda w: posteriors(w.numpy()), wav16k), axis=0)
        labels = torch.from_numpy(aligned_labels(probs, ids, posteriors.symbols))
        if labels.numel() < frames:  # the classifier's frame count can differ by one at the end
            labels = torch.cat([labels, labels[-1:].repeat(frames - labels.numel())])
        return labels[:frames].reshape(1, -1)


def conversion_request(frontend, aligner: SourceAligner, source: PromptAudio, target, *, source_text: str | None = None,
                       seed: int | None = None, sample_rate: int, max_seconds: float = MAX_SOURCE_SECONDS,
                       capacity: int | None = None) -> SynthesisRequest:
    """The engine request that says what ``source`` says in the voice of ``target`` (a ``SpeakerPrompt``: its flow
    prompt). ``source``: a path, encoded bytes or ``(samples, rate)`` at any rate, at most ``max_seconds`` long;
    ``source_text``: what it says (phoneme models only, see ``SourceAligner``); ``capacity``: the speech tokens the
    model's flow renders after the voice's prompt (``CosyVoice2Engine.speech_capacity``), which bounds the source.
    Raises ``InputError``/``AudioError``/``TextError`` for bad arguments before any model work."""
    check_seed(seed)
    check_text_arg(source_text, "source_text", optional=True, max_chars=MAX_PROMPT_TEXT_CHARS)  # a transcript's bounds
    wav, sr = read_prompt_audio(source, sample_rate)
    validate_prompt_audio(wav, sr, max_seconds=min(max_seconds, MAX_SOURCE_SECONDS), **SOURCE_WORDING)
    if capacity is not None and wav.numel() / sr > capacity / TOKENS_PER_S:
        raise AudioError(f"the source audio is too long for this model with this voice: {wav.numel() / sr:.2f} s, "
                         f"at most {max(capacity / TOKENS_PER_S, 0):.1f} s (its flow renders "
                         f"{frontend.config.flow.cfm.noise_frames} mel frames at most, the voice's prompt included): "
                         "convert it in parts")
    wav16k = resample(wav, sr, 16000)
    tokens = source_tokens(frontend, wav16k) if source_text is None else aligner.tokens(wav16k, source_text)
    return SynthesisRequest(mode="vc", voice=target, source_tokens=tokens, seed=seed)


def renders_whole(request: SynthesisRequest) -> bool:
    """Whether the flow renders a conversion at once (up to 30 s of source) or chunk by chunk (longer)."""
    return request.source_tokens.shape[1] <= WHOLE_FLOW_TOKENS


def convert_voice_request(tts, source: PromptAudio, prompt_wav: PromptAudio | None, *, speaker: str | None,
                          source_text: str | None, seed: int | None) -> SynthesisRequest:
    """``Cadenza.convert_voice``'s request: the target is ``prompt_wav``'s voice, the saved ``speaker``'s, or with
    neither the model's default voice; the cheap refusals come before any audio is read."""
    check_seed(seed)
    check_text_arg(source_text, "source_text", optional=True, max_chars=MAX_PROMPT_TEXT_CHARS)
    target = conversion_target(tts, prompt_wav, speaker)
    return conversion_request(tts.engine.frontend, tts.source_aligner, source, target, source_text=source_text,
                              seed=seed, sample_rate=tts.sample_rate, capacity=tts.engine.speech_capacity(target))


def conversion_target(tts, prompt_wav: PromptAudio | None, speaker: str | None, voice=None):
    """The ``SpeakerPrompt`` a conversion speaks in: ``prompt_wav``'s voice, the saved ``speaker``'s, a voice store's
    ``voice`` (as the server resolves one), or with none the model's default voice (a saved voice is checked before
    any audio is read)."""
    if voice is not None:
        if prompt_wav is not None or speaker is not None:
            raise InputError("give one target voice: prompt_wav, speaker or voice")
        return tts._conditioning(voice, None)[0]
    if prompt_wav is not None and speaker is not None:
        raise InputError("give either prompt_wav or speaker as the target voice, not both")
    if speaker is None and prompt_wav is None and tts.default_speaker is None:
        raise InputError("this model has no default voice: give prompt_wav or speaker as the target voice")
    if prompt_wav is None:  # its flow prompt is the target
        return tts._voice(None, None, None, None, speaker)[0]
    return tts.voice_from_audio(prompt_wav)


def live_conversion(tts, target, sample_rate: int, *, seed: int | None, max_seconds: float) -> LiveConversion:
    """A ``LiveConversion`` into ``target`` (a ``SpeakerPrompt``) of at most ``max_seconds`` of source (bounded
    further by the flow's noise buffer with the voice's prompt, as ``conversion_request``)."""
    check_seed(seed)
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)) or not max_seconds > 0:
        raise InputError(f"max_seconds must be a positive number of seconds, got {max_seconds!r}")
    seconds = min(float(max_seconds), MAX_SOURCE_SECONDS, tts.engine.speech_capacity(target) / TOKENS_PER_S)
    if seconds < 1:
        raise AudioError("this voice's prompt leaves no room for a source in this model's flow: choose a shorter voice")
    request = SynthesisRequest(mode="vc", voice=target, source_tokens=torch.zeros(1, 0, dtype=torch.long),
                               live_source=True, seed=seed, max_tokens=int(seconds * TOKENS_PER_S) + 1)
    return LiveConversion(tts.engine.scheduler.submit, tts.engine.frontend.speech_tokens, tts.mark, request,
                          sample_rate=sample_rate, max_seconds=seconds)
