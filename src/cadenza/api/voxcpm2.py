"""The public Python API for VoxCPM 2 models, in the style of ``Cadenza`` (``cadenza.load`` picks the family).

::

    tts = cadenza.load("VoxCPM2")                                   # the released folder, unchanged
    tts.synthesize("(A warm, low voice)Hello there.").save("designed.wav")        # voice design
    tts.synthesize("Hello!", reference_wav="me.wav")                               # reference cloning
    tts.synthesize("Hello!", prompt_wav="me.wav", prompt_text="what I say")        # continuation cloning
    for chunk in tts.synthesize_stream("Hello!", reference_wav="me.wav"): ...      # 48 kHz chunks
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from cadenza.api import markup
from cadenza.api.arguments import (
    MAX_INSTRUCTIONS_CHARS,
    check_prompt_text,
    check_seed,
    check_speed,
    check_text_arg,
    seed_at,
)
from cadenza.api.audio import Audio
from cadenza.api.protocol import Capabilities, Plan
from cadenza.api.request_batches import LAZY_PLAN_CHARS, stream_long_text_voxcpm2
from cadenza.api.text_feed import feed_in_background
from cadenza.api.timestamps import check_timestamps, timed_stream, timed_text_stream, with_words
from cadenza.audio.speed_range import MAX_SPEED, MIN_SPEED, speed_in_range
from cadenza.audio.time_scale import TIME_SCALE_METHODS, TimeScaledChunks, time_scale
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.text_stream import SentenceTextStream
from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import InputError, TextError, UnknownSpeakerError
from cadenza.loading.hub import folder_name, locate_model
from cadenza.models.voxcpm2.prompt import PromptAudio
from cadenza.models.voxcpm2.request_text import is_speakable, split_description
from cadenza.provenance import Watermark
from cadenza.provenance.marking import OutputMark
from cadenza.text import normalize as normalize_text
from cadenza.text import split_text
from cadenza.voices.prompts import Voice
from cadenza.voices.store import VoiceStore, open_voices
from cadenza.voices.voxcpm2_prompts import CLONING_MODES, VoxCPM2Prompts

# Text tokens per segment of a long input. VoxCPM 2 reads long texts whole (8192 positions: ~20 min of speech), and a
# voice that is not pinned by audio (plain or designed) may change between segments, so segments are long.
SEGMENT_TOKENS = 300


class VoxCPM2:
    """A loaded VoxCPM 2 model. Thread-safe (see ``VoxCPM2Engine``)."""

    family = "voxcpm2"

    def __init__(self, engine: VoxCPM2Engine, directory: Path, voices: VoiceStore | None = None,
                 watermark: bool | bytes | Watermark = True, speed_method: str = "auto") -> None:
        _check_speed_method(speed_method)
        self.engine = engine
        self.speed_method = speed_method  # how speed != 1 time-scales the output (audio/time_scale.py)
        self.directory = directory
        # Every output carries the provenance mark unless the operator turns it off here (docs/provenance.md).
        self.mark = OutputMark.for_model(self.sample_rate, folder_name(directory), watermark)
        self.voices = voices  # saved voices (SQLite), shared with `cadenza serve`
        self.voice_prompts = VoxCPM2Prompts(self, voices) if voices is not None else None
        self._owns_voices = False  # opened by from_pretrained: closed by close()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str = "cpu", dtype: torch.dtype | str | None = None,
                        lora: str | os.PathLike | None = None, scheduler: SchedulerConfig | None = None,
                        voices_dir: str | os.PathLike | None = None, watermark: bool | bytes | Watermark = True,
                        revision: str | None = None, speed_method: str | None = None) -> VoxCPM2:
        """``path``: a VoxCPM 2 folder or a hub name (``"openbmb/VoxCPM2"``, pinned by ``@rev`` or ``revision``;
        docs/models.md). ``dtype`` None: float32 on CPU, the config's dtype (bf16) on GPU. ``lora``: a LoRA folder.
        ``scheduler``: limits of the request scheduler that batches concurrent requests. ``voices_dir``: a saved-voice
        store (its VoxCPM 2 voices are then usable as ``speaker=``). ``speed_method``: how ``speed != 1`` time-scales
        the output, ``"auto"`` (default: the phase vocoder to speed up, WSOLA to slow down), ``"phase_vocoder"`` or
        ``"wsola"`` (docs/controls.md, "Speed")."""
        if path is None:
            raise InputError("a VoxCPM 2 model folder or hub name is needed (cadenza.load(None) is the built-in model)")
        if speed_method is not None:  # fails before anything is read
            _check_speed_method(speed_method)
        directory = locate_model(path, revision)
        options = {} if scheduler is None else {"scheduler": scheduler}
        engine = VoxCPM2Engine.from_pretrained(directory, device=device, dtype=dtype, lora=lora, **options)
        model = cls(engine, directory, open_voices(voices_dir), watermark,
                    speed_method or "auto")
        model._owns_voices = voices_dir is not None
        return model

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    def request(self, text: str, *, reference_wav: PromptAudio | None = None, prompt_wav: PromptAudio | None = None,
                prompt_text: str | None = None, speaker: str | None = None, seed: int | None = None,
                normalize: bool = True, speed: float = 1.0, **options):
        """Modes: plain text; ``(description)text`` voice design; ``reference_wav`` cloning; ``prompt_wav`` +
        ``prompt_text`` continuation; reference + continuation combined; ``speaker``: a saved VoxCPM 2 voice of the
        voice store (by name or id; cloned as it was made). ``options``: ``voice`` (a prepared ``VoicePrompt``),
        ``cfg_value``, ``inference_timesteps``, ``retry``, ``retry_max_attempts``, ``min_len``, ``max_len``, ``lora`` (a
        registered adapter's name: ``register_lora``).

        Text arguments must be strings of valid Unicode without NUL, ``seed`` an integer in [0, 2**63) (``TextError``
        / ``InputError`` naming the argument, before any work). ``speed`` (0.5-2.0): speaking rate, applied to the
        output by a pitch-preserving time-scale (``speed_method``; VoxCPM 2's latent rate is fixed, docs/controls.md)."""
        check_text_arg(text, "text")
        check_prompt_text(prompt_text)
        check_seed(seed)
        speed = _check_speed(speed)
        options = _check_options(options)
        if speaker is not None:
            if any(a is not None for a in (reference_wav, prompt_wav, prompt_text, options.get("voice"))):
                raise InputError("give either speaker (a saved voice) or voice audio, not both")
            options["voice"] = self._saved_voice(speaker)
        request = self.engine.build(text, reference_wav=reference_wav, prompt_wav=prompt_wav,
                                    prompt_text=prompt_text, seed=seed, normalize=normalize, **options)
        request.speed = speed
        return request

    def _saved_voice(self, speaker: object):
        return self._saved(speaker).prompt

    def _saved(self, speaker: object) -> Voice:
        """The saved voice ``speaker`` (by name or id; its use counted once)."""
        if not isinstance(speaker, str) or not speaker.strip():
            raise InputError("speaker must be a saved voice's name or id")
        if self.voice_prompts is None:
            raise UnknownSpeakerError(f"no voice store is open, so there is no saved voice {speaker[:80]!r}: load "
                                      "the model with voices_dir=... (the folder `cadenza serve --voices-dir` uses)")
        return self.voice_prompts.resolve(speaker)

    def synthesize(self, text: str, *, input_format: str | None = None, lexicon=None, timestamps: bool = False,
                   **kwargs) -> Audio:
        """``input_format="ssml"`` (or text that starts with ``<speak``) reads SSML, ``lexicon=`` applies a
        pronunciation lexicon (docs/text.md). ``timestamps=True``: ``Audio.words`` holds each word's start and end
        (docs/controls.md)."""
        if check_timestamps(timestamps):
            return with_words(self.synthesize(text, input_format=input_format, lexicon=lexicon, **kwargs), text)
        pieces = list(self.synthesize_iter(text, input_format=input_format, lexicon=lexicon, **kwargs))
        return Audio(np.concatenate(pieces) if pieces else np.zeros(0, np.float32), self.sample_rate)

    def synthesize_iter(self, text: str, *, progress: Callable[[int, int], None] | None = None,
                        input_format: str | None = None, lexicon=None, timestamps: bool = False,
                        **kwargs) -> Iterator[np.ndarray]:
        """``synthesize`` as pieces in order, as ``Cadenza.synthesize_iter`` (``cadenza synth -o`` writes them as
        they come): SSML gives each segment and break, plain text one piece (VoxCPM 2 reads a text whole) unless it
        is too long for one pass (``_whole_tokens``): then each of its segments.
        ``progress(done, total)`` after each; ``timestamps=True``: ``TimedChunk`` s."""
        if progress is not None and not callable(progress):  # before the work
            raise InputError(f"progress must be a callable progress(done, total), not {type(progress).__name__}")
        if check_timestamps(timestamps):
            pieces = self.synthesize_iter(text, progress=progress, input_format=input_format, lexicon=lexicon, **kwargs)
            return timed_stream(pieces, text, self.sample_rate)
        if markup.wanted(self, text, input_format, lexicon, kwargs.get("speaker")):
            return markup.synthesize_iter(self, text, input_format=input_format, lexicon=lexicon, progress=progress,
                                          **kwargs)
        if segments := self._long_segments(text, kwargs):
            return markup.synthesize_iter(self, text, progress=progress, segments=segments, **kwargs)
        return self._whole(self.request(text, **kwargs), progress)  # the request checked now, not at the first piece

    @property
    def _whole_tokens(self) -> int:
        """The most text tokens read in one pass: a quarter of the model's positions (2,048 of the release's 8,192),
        since the speech takes about two positions per text token and the prompt some more."""
        return max(SEGMENT_TOKENS, self.engine.config.max_length // 4)

    def _long_segments(self, text: object, kwargs: dict) -> list[str] | None:
        """Plain ``text`` too long to read in one pass (``_whole_tokens``), cut into segments of up to that many
        tokens (spoken with ``seed + k``), as few as fit, since a voice not pinned by audio may change between them;
        None for a text read whole. Read whole, such a text ran out of the model's positions (the text, the prompt
        and the speech share them): a 17,000-character file was refused outright, a shorter one cut short."""
        check_text_arg(text, "text")  # the cheap checks of ``request`` first: a bad argument is named before any work
        check_prompt_text(kwargs.get("prompt_text"))
        check_seed(kwargs.get("seed"))
        if len(text) * 16 < self._whole_tokens:  # no character reads out longer than "5℃" -> "five degrees Celsius"
            return None  # (10 characters each; a character is at least one token): it fits, nothing to count
        try:
            segments = self.segments(text, normalize=kwargs.get("normalize", True), max_tokens=self._whole_tokens)
        except InputError:
            return None  # the request's own checks name what is wrong
        return segments if len(segments) > 1 else None

    def _whole(self, request, progress: Callable[[int, int], None] | None) -> Iterator[np.ndarray]:
        audio = self.engine.synthesize(request)
        if request.speed != 1.0:
            audio = time_scale(audio, request.speed, self.sample_rate, self.speed_method)
        yield self.mark.whole(audio)
        if progress is not None:
            progress(1, 1)

    def synthesize_stream(self, text: str | Iterable[str], *, input_format: str | None = None, lexicon=None,
                          timestamps: bool = False, **kwargs) -> Iterator[np.ndarray]:
        """48 kHz float32 chunks (one per generated patch) as soon as each is made (``timestamps=True``:
        ``TimedChunk`` s, each chunk with the word timings it settled; docs/controls.md).

        ``text`` may also be an iterable of text pieces (e.g. tokens streamed from an upstream LLM): each sentence is
        spoken once it is complete (VoxCPM 2 reads whole texts), as the server's WebSocket speaks them; the voice
        (``speaker``, ``reference_wav``, ``prompt_wav`` + ``prompt_text``), ``seed``, ``speed`` and ``lora`` apply to
        every sentence, and ``instructions`` (a voice description) too. Closing the returned generator cancels what
        is in flight."""
        if isinstance(text, (bytes, bytearray)) or not (isinstance(text, str) or hasattr(text, "__iter__")):
            raise TextError(f"text must be a string or an iterable of strings, not {type(text).__name__}")
        if check_timestamps(timestamps):
            return timed_text_stream(self.synthesize_stream, text, self.sample_rate, input_format=input_format,
                                     lexicon=lexicon, **kwargs)
        if not isinstance(text, str):
            kwargs.pop("normalize", None)  # each sentence is normalised as it completes, as the server does
            pieces = markup.lexicon_pieces(self, iter(text), input_format, lexicon, kwargs.get("speaker"))
            return self.mark.stream(self._sentences(pieces, **kwargs))
        if markup.wanted(self, text, input_format, lexicon, kwargs.get("speaker")):
            return markup.synthesize_stream(self, text, input_format=input_format, lexicon=lexicon, **kwargs)
        if len(text) > LAZY_PLAN_CHARS:  # a book: planned a block at a time as it is read
            return stream_long_text_voxcpm2(self, text, kwargs)
        if segments := self._long_segments(text, kwargs):
            return markup.synthesize_stream(self, text, segments=segments, **kwargs)
        request = self.request(text, **kwargs)
        chunks = self.engine.stream(request)
        if request.speed != 1.0:
            chunks = iter(TimeScaledChunks(chunks, request.speed, self.sample_rate, self.speed_method))
        return self.mark.stream(chunks)

    def _sentences(self, pieces: Iterator[str], *, speaker: str | None = None,
                   reference_wav: PromptAudio | None = None, prompt_wav: PromptAudio | None = None,
                   prompt_text: str | None = None, seed: int | None = None, speed: float = 1.0,
                   lora: str | None = None, instructions: str | None = None, **options) -> Iterator[np.ndarray]:
        """Pieces -> sentences -> audio through ``open_text_stream`` (the server's path), fed on a thread of its own.
        ``instructions``: a voice description for every sentence (a leading ``(description)`` in the first piece
        applies to the first sentence only)."""
        if options:
            raise InputError(f"{', '.join(sorted(options))} cannot be set for text that arrives in pieces (each "
                             "sentence is planned as the server plans it): leave it out, or give the whole text")
        check_prompt_text(prompt_text)
        if speaker is not None:
            if any(a is not None for a in (reference_wav, prompt_wav, prompt_text)):
                raise InputError("give either speaker (a saved voice) or voice audio, not both")
            voice = self._saved(speaker)
        elif reference_wav is not None or prompt_wav is not None or prompt_text is not None:
            prompt = self.engine.voice(reference_wav=reference_wav, prompt_wav=prompt_wav, prompt_text=prompt_text)
            mode = "reference" if prompt_wav is None else "continuation" if reference_wav is None else "combined"
            voice = Voice(prompt, "request", mode)
        else:
            voice = None
        stream = self.open_text_stream(voice, instructions=instructions, seed=seed, lora=lora, speed=speed)
        feed_in_background(pieces, stream, lambda piece: is_speakable(split_description(piece)[1]))
        return iter(stream)

    def design(self, description: str, text: str, **kwargs) -> Audio:
        """Voice design: a voice described in words (no audio)."""
        if any(kwargs.get(k) is not None for k in ("reference_wav", "prompt_wav")):
            raise InputError("voice design takes a description, not audio: use clone for reference audio")
        check_text_arg(description, "description", max_chars=MAX_INSTRUCTIONS_CHARS)
        check_text_arg(text, "text")
        description = description.strip().strip("()")
        if not description:
            raise InputError("the voice description is empty")
        return self.synthesize(f"({description}){text}", **kwargs)

    # -- serving (cadenza.api.protocol.SpeechModel) ------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        vae = self.engine.vae
        return Capabilities(
            family=self.family, title="VoxCPM 2", sample_rate=self.sample_rate,
            modes=("plain", "voice_design", "reference", "continuation", "combined"), instructions="voice_design",
            speed=(MIN_SPEED, MAX_SPEED), text_streaming="sentences", cloning_modes=CLONING_MODES, default_voice=True,
            output_frame_samples=self.engine.config.patch_size * vae.decode_hop_length)

    def prompt_library(self, store: VoiceStore, cache_size: int = 64) -> VoxCPM2Prompts:
        """Saved voices of ``store`` as this model's prompts (the API's own library when it is the same store)."""
        if store is self.voices and self.voice_prompts is not None:
            return self.voice_prompts
        return VoxCPM2Prompts(self, store, cache_size)

    def segments(self, text: str, normalize: bool = True, max_tokens: int | None = None) -> list[str]:
        """Text -> segments of at most ``max_tokens`` (default and at least ``SEGMENT_TOKENS``) tokens, each starting
        with the text's leading ``(description)`` when it has one, so every segment is spoken in the designed voice."""
        check_text_arg(text, "text")
        description, spoken = split_description(text)
        if normalize and spoken.strip():
            spoken = normalize_text(spoken)
        tokenizer = self.engine.tokenizer
        budget = max(max_tokens or SEGMENT_TOKENS, SEGMENT_TOKENS)
        pieces = [p for p in split_text(spoken, budget, count_tokens=lambda t: len(tokenizer.encode(t)))
                  if is_speakable(p)]
        if not pieces:
            raise TextError("text has nothing to speak after normalisation: it needs at least one letter or digit")
        head = f"({description})" if description is not None else ""
        return [head + p for p in pieces]

    def speakable(self, text: str) -> bool:
        """Whether ``text`` (after any leading description) holds a letter or digit to speak."""
        return isinstance(text, str) and is_speakable(split_description(text)[1])

    def plan(self, segments, voice: Voice | None, *, instructions: str | None = None, seed: int | None = None,
             speed: float = 1.0, lora: str | None = None) -> Plan:
        """One request per segment. ``instructions``: a voice description (voice design; with a reference voice, it
        steers that voice). ``speed``: applied to each request's output (WSOLA, see ``request``). ``lora``: a
        registered adapter's name for every segment (``UnknownLoRAError`` listing them otherwise)."""
        speed = _check_speed(speed)
        check_seed(seed)
        if instructions is not None:
            check_text_arg(instructions, "instructions", max_chars=MAX_INSTRUCTIONS_CHARS)
            description = " ".join(instructions.split()).strip("()")
            if not description or "(" in description or ")" in description:
                raise InputError("instructions describe the voice in words (no parentheses)")
        requests, n_text = [], 0
        for i, segment in enumerate(segments):
            if instructions is not None:
                if split_description(segment)[0] is not None:
                    raise InputError("give the voice description either as instructions or as '(description)' at "
                                     "the start of the input, not both")
                segment = f"({description}){segment}"
            request = self.engine.build(segment, voice=None if voice is None else voice.prompt,
                                        seed=None if seed is None else (seed + i) % 2**62, normalize=False, lora=lora)
            request.speed = speed
            n_text += request.target_len
            requests.append(request)
        return Plan(requests, n_text)

    def submit(self, request, stream: bool = True):
        chunks = self.engine.scheduler.submit(request, stream=stream)
        if request.speed == 1.0:
            return chunks
        return TimeScaledChunks(chunks, request.speed, self.sample_rate, self.speed_method)

    def open_text_stream(self, voice: Voice | None, *, instructions: str | None = None,
                         seed: int | None = None, lora: str | None = None,
                         speed: float = 1.0) -> SentenceTextStream:
        """Text in piece by piece, each sentence spoken once it is complete (VoxCPM 2 reads whole texts)."""
        check_seed(seed)
        speed = _check_speed(speed)
        if lora is not None:
            self.engine.loras.get(lora)  # an unknown adapter fails now, not at the first sentence

        def make(text: str, index: int) -> list:
            if not is_speakable(split_description(text)[1]):
                return []
            segments = self.segments(text)
            first = seed_at(seed, 1000 * index)
            return self.plan(segments, voice, instructions=instructions, seed=first, lora=lora, speed=speed).requests

        return SentenceTextStream(self.submit, make)

    @property
    def load(self) -> tuple[int, int]:
        return self.engine.scheduler.load

    @property
    def limits(self) -> SchedulerConfig:
        return self.engine.scheduler.config

    def load_lora(self, path: str | os.PathLike) -> None:
        self.engine.load_lora(path)

    def set_lora_enabled(self, enabled: bool) -> None:
        self.engine.set_lora_enabled(enabled)

    def merge_lora(self) -> None:
        self.engine.merge_lora()

    # Per-request adapters: registered by name, chosen with lora=name, batched together (docs/voxcpm2.md)
    def register_lora(self, name: str, path: str | os.PathLike) -> None:
        """Register a LoRA checkpoint folder as ``name`` (``synthesize(..., lora=name)`` uses it; the weights and
        requests without it are not changed)."""
        self.engine.register_lora(name, path)

    def register_lora_tensors(self, name: str, config, tensors: dict[str, torch.Tensor], source: str = "LoRA weights"):
        """``register_lora`` from a ``LoRAConfig`` and the adapter tensors in memory (an upload); returns the
        adapter (``.n_parameters``)."""
        return self.engine.register_lora_tensors(name, config, tensors, source)

    def unregister_lora(self, name: str) -> None:
        """Remove adapter ``name`` (``LoRAInUseError`` while requests that use it are queued or running)."""
        self.engine.unregister_lora(name)

    @property
    def loras(self) -> list[str]:
        """Names of the registered per-request adapters."""
        return self.engine.loras.names

    def close(self) -> None:
        self.engine.close()
        if self._owns_voices:
            self.voices.close()

    def __enter__(self) -> VoxCPM2:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Arguments of CosyVoice 2's API with no VoxCPM 2 meaning, and what to do instead.
_OTHER_FAMILY = {
    "instruct": "describe the voice as '(description)text' (or VoxCPM2.design)",
    "text_ids": "pass the text itself",
    "prompt_text_ids": "pass the transcript as prompt_text",
}
_OPTIONS = frozenset({"voice", "cfg_value", "inference_timesteps", "retry", "retry_max_attempts", "retry_ratio",
                      "min_len", "max_len", "stream_holdback", "reference_stream_onset", "noise", "lora"})


def _check_speed_method(method: object) -> None:
    if method not in TIME_SCALE_METHODS:
        raise InputError(f"speed_method must be one of {', '.join(TIME_SCALE_METHODS)}, not {method!r}"[:200])


def _check_speed(speed: object) -> float:
    return speed_in_range(check_speed(speed))


def _check_options(options: dict) -> dict:
    """``options``, or an ``InputError`` naming any argument VoxCPM 2 does not take (instead of a TypeError deep
    in the engine)."""
    kept = {}
    for name, value in options.items():
        if name in _OTHER_FAMILY:
            raise InputError(f"VoxCPM 2 models do not take {name}: {_OTHER_FAMILY[name]}")
        if name not in _OPTIONS:
            raise InputError(f"VoxCPM 2 models do not take {name!r} (options: {', '.join(sorted(_OPTIONS))})")
        kept[name] = value
    return kept
