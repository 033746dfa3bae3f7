"""``Cadenza``: the public Python API of CosyVoice 2 models, ``Cadenza.from_pretrained(path).synthesize(text, ...)``.

A small class over the parts (loader -> model, frontend, engine), in the spirit of F5-TTS's ``api.py``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from cadenza import builtin
from cadenza.api import markup
from cadenza.api import voice_conversion as conversion
from cadenza.api.arguments import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_SPEAKER_ID_CHARS,
    check_ids,
    check_prompt_text,
    check_seed,
    check_speaker,
    check_speed,
    check_text_arg,
    reference_as_prompt,
    refuse_unknown,
    seed_at,
)
from cadenza.api.audio import Audio, PromptAudio, read_prompt_audio
from cadenza.api.cosyvoice2_text_stream import cosyvoice2_text_stream
from cadenza.api.live_conversion import LiveConversion
from cadenza.api.protocol import Capabilities, Plan
from cadenza.api.request_batches import LAZY_PLAN_CHARS, request_batches, stream_long_text
from cadenza.api.text_feed import feed_in_background
from cadenza.api.timestamps import check_timestamps, timed_stream, timed_text_stream, with_words
from cadenza.builtin import BUILTIN_NAME, read_model_metadata, resolve_model_path
from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.long_form import iterate_segments, stream_segments
from cadenza.engine.precision import Precision
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduler_config import SchedulerConfig
from cadenza.engine.stream_schedule import SPEED_METHODS, StreamSchedule
from cadenza.engine.text_stream import SentenceTextStream, TokenTextStream
from cadenza.errors import CheckpointError, InputError, TextError, UnknownSpeakerError
from cadenza.loading.hub import folder_name
from cadenza.models.cosyvoice2.frontend import CosyVoice2Frontend, check_speakable, is_speakable
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt, SpeakerStore, validate_speaker_id
from cadenza.provenance import Watermark
from cadenza.provenance.marking import OutputMark
from cadenza.text import normalize as normalize_text
from cadenza.text import split_text
from cadenza.voices import VoiceStore, open_voices
from cadenza.voices.cosyvoice2_prompts import CosyVoice2Prompts
from cadenza.voices.prompts import Voice

log = logging.getLogger(__name__)

SEGMENT_TOKENS = 80  # text tokens per segment (the reference splits at 60-80)
STREAMED_TEXT_ARGUMENTS = ("prompt_wav", "prompt_text", "prompt_text_ids", "instruct", "speaker", "seed", "speed",
                           "reference_wav")


class Cadenza:
    """A loaded speech model. Thread-safe for concurrent ``synthesize`` calls (no per-request state is shared)."""

    family = "cosyvoice2"

    def __init__(self, engine: CosyVoice2Engine, directory: Path, voices: VoiceStore | None = None,
                 watermark: bool | bytes | Watermark = True) -> None:
        self.engine = engine
        self.directory = directory
        # Every output carries the provenance mark unless the operator turns it off here (docs/provenance.md).
        self.mark = OutputMark.for_model(self.sample_rate, folder_name(directory), watermark)
        self.voices = voices  # saved voices (SQLite); also served by `cadenza serve`
        self.voice_prompts = CosyVoice2Prompts(self, voices) if voices is not None else None
        self._owns_voices = False  # opened by from_pretrained: closed by close()
        # The voice used when a request names none (cadenza.json's default_speaker; else an arbitrary voice).
        meta = read_model_metadata(directory)
        if meta.get("status") == "experimental":
            log.warning("%s: experimental weights: %s", meta.get("name", directory.name), meta.get("status_note", ""))
        default = meta.get("default_speaker")
        self.default_speaker = default if isinstance(default, str) and default in engine.speakers else None
        self.lm_prompt = meta.get("lm_prompt", True)  # cadenza.json; False: no LM prompt (_lm_conditioning)
        self.source_aligner = conversion.SourceAligner(self.directory, self.engine.frontend)  # for source_text

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None, device: str = "cpu",
                        dtype: str | torch.dtype | Precision = torch.float32,
                        voices_dir: str | os.PathLike | None = None,
                        scheduler: SchedulerConfig | None = None, watermark: bool | bytes | Watermark = True,
                        revision: str | None = None, speed_method: str | None = None,
                        stream_schedule: StreamSchedule | None = None) -> Cadenza:
        """Load a released CosyVoice 2 directory (unchanged), or the built-in cadenza-tiny when ``path`` is None, or a
        hub name (``"FunAudioLLM/CosyVoice2-0.5B"``, pinned by ``@rev`` or ``revision``; docs/models.md);
        ``voices_dir`` opens a saved-voice store; ``scheduler``: limits and worker layout of the request scheduler
        (default ``SchedulerConfig()``); ``speed_method``: how ``speed != 1`` changes the rate (one of
        ``SPEED_METHODS``, explained at ``StreamSchedule.speed_method`` and in docs/controls.md, "Speed"); default:
        what the folder's ``cadenza.json`` names, else ``"auto"``. ``stream_schedule``: how streams are cut into
        chunks (default ``StreamSchedule()``; ``StreamSchedule.reference()``: exactly the reference's; docs/design.md
        "CosyVoice 2 streaming schedule"); its speed method gives way to ``speed_method``, then to the folder's own.

        ``dtype``: ``float32`` (default; the parity mode, bit for bit the reference's arithmetic), ``"bfloat16"``
        (flow and HiFT in bfloat16, the LM in float32), ``"auto"`` (bfloat16 where the CPU has AMX / AVX-512 BF16
        or the GPU supports it, else float32), or a ``cadenza.engine.precision.Precision`` (e.g. with the int8 LM).
        Speed and accuracy of each: docs/performance.md, "CPU fast path". An unknown value is an ``InputError``.

        Every file of the folder is read and checked here (configs, weights, tokenizer, speech tokenizer, speaker
        encoder, saved speakers, ``cadenza.json``), and each frontend model is run once, so a broken or mismatched
        file is a ``CheckpointError`` naming the file now, never a failure of a later request."""
        precision = Precision.choose(dtype, device)  # a bad value fails before anything is read
        if speed_method is not None and speed_method not in SPEED_METHODS:  # fails before anything is read
            raise InputError(f"speed_method must be one of {', '.join(SPEED_METHODS)}, not {speed_method!r}"[:200])
        directory = resolve_model_path(path, revision)
        files = inspect_directory(directory)  # raises with the list of what is missing
        meta = read_model_metadata(directory)  # small and cheap: a bad cadenza.json fails before the weights load
        stream_schedule = StreamSchedule() if stream_schedule is None else stream_schedule
        if not isinstance(stream_schedule, StreamSchedule):
            raise InputError(f"stream_schedule must be a StreamSchedule, not {type(stream_schedule).__name__}")
        method = speed_method or meta.get("speed_method") or stream_schedule.speed_method
        schedule = replace(stream_schedule, speed_method=method)
        model = load_cosyvoice2_weights(files, device=device)  # float32; the engine converts it to ``precision``
        frontend = CosyVoice2Frontend(files, model.config)
        frontend.load_all()
        speakers = SpeakerStore(files.spk2info or directory / "spk2info.pt")
        speakers.verify(model.config)
        default = meta.get("default_speaker")
        if default is not None and default not in speakers:
            known = ", ".join(speakers.ids()[:20]) or "none"
            raise CheckpointError(f"{directory / 'cadenza.json'}: default_speaker {default!r} is not a saved speaker "
                                  f"of spk2info.pt (saved: {known})")
        voices = open_voices(voices_dir)
        tts = cls(CosyVoice2Engine(model, frontend, speakers, schedule=schedule,
                                   scheduler_config=scheduler, precision=precision), directory, voices, watermark)
        tts._owns_voices = voices is not None
        return tts

    @property
    def sample_rate(self) -> int:
        return self.engine.config.sample_rate

    @property
    def speakers(self) -> list[str]:
        return self.engine.speakers.ids()

    # -- voices --------------------------------------------------------------------------------------------------
    def voice_from_audio(self, prompt_wav: PromptAudio, prompt_text: str | None = None) -> SpeakerPrompt:
        wav, sr = read_prompt_audio(prompt_wav, self.sample_rate)
        return self.engine.frontend.prompt_from_audio(wav, sr, prompt_text)

    def add_speaker(self, speaker_id: str, prompt_wav: PromptAudio, prompt_text: str, save: bool = True) -> None:
        """Save a zero-shot voice under ``speaker_id`` (written to ``spk2info.pt`` in the model directory)."""
        if not isinstance(speaker_id, str):
            raise InputError(f"speaker id must be a string, not {type(speaker_id).__name__}")
        if len(speaker_id) > MAX_SPEAKER_ID_CHARS:
            raise InputError(f"speaker id is {len(speaker_id)} characters; at most {MAX_SPEAKER_ID_CHARS}")
        validate_speaker_id(speaker_id)  # before the audio is decoded
        check_prompt_text(prompt_text)
        if save and self.directory.resolve() == Path(builtin.__file__).resolve().parent / "assets" / BUILTIN_NAME:
            raise InputError("the built-in model folder is part of the installed package and is not written to: "
                             "save voices in a voice store instead (`cadenza serve` /v1/voices, or "
                             "cadenza.voices.VoiceStore), or add_speaker(..., save=False) for this session")
        self.engine.speakers.add(speaker_id, self.voice_from_audio(prompt_wav, prompt_text))
        if save:
            self.engine.speakers.save(self.directory / "spk2info.pt")

    # -- synthesis -----------------------------------------------------------------------------------------------
    def _voice(self, prompt_wav, prompt_text, prompt_text_ids, instruct, speaker):
        """Resolve the voice arguments into (voice, mode, LM prompt text ids, LM prompt speech ids)."""
        eng = self.engine
        check_prompt_text(prompt_text)
        check_text_arg(instruct, "instruct", optional=True, max_chars=MAX_INSTRUCTIONS_CHARS)
        if speaker is not None:
            check_speaker(speaker, self.engine.speakers)
        if prompt_wav is not None and speaker is not None:
            raise InputError("give either prompt_wav or speaker, not both")
        if speaker is not None and (prompt_text is not None or prompt_text_ids is not None):
            raise InputError("prompt_text goes with prompt_wav: a saved speaker brings its own transcript")
        if instruct is not None and (prompt_text is not None or prompt_text_ids is not None):
            raise InputError("instruct replaces the prompt transcript: give instruct or prompt_text, not both")
        if prompt_text is not None and prompt_text_ids is not None:
            raise InputError("give either prompt_text or prompt_text_ids, not both")
        if prompt_text_ids is not None:
            check_ids(prompt_text_ids, "prompt_text_ids")
        lm_text = eng.check_text_ids(prompt_text_ids, "prompt_text_ids") if prompt_text_ids is not None else None
        transcript_given = prompt_text is not None or prompt_text_ids is not None
        if speaker is not None:
            if self.voice_prompts is not None:  # the voice store first, then the model's spk2info.pt
                resolved = self.voice_prompts.resolve(speaker)
                voice, mode = resolved.prompt, resolved.mode
            else:
                voice, mode = eng.speakers.get(speaker), "speaker"
            lm_text = voice.prompt_text
            lm_speech = None if mode == "cross_lingual" else voice.llm_prompt_speech
        elif prompt_wav is not None:
            voice = self.voice_from_audio(prompt_wav, prompt_text)
            mode = "zero_shot" if transcript_given else "cross_lingual"
            lm_text = voice.prompt_text if lm_text is None else lm_text
            lm_speech = voice.flow_prompt_speech if transcript_given else None
        elif transcript_given:
            raise InputError("prompt_text needs prompt_wav (the recording it transcribes)")
        elif self.default_speaker is not None:
            voice, mode = eng.speakers.get(self.default_speaker), "speaker"
            lm_text, lm_speech = voice.prompt_text, voice.llm_prompt_speech
        else:
            voice, mode, lm_speech = None, "default_voice", None
            log.warning("no voice given (prompt_wav or speaker): using an arbitrary voice")
        return (voice, *self._lm_conditioning(mode, lm_text, lm_speech, instruct))

    def _lm_conditioning(self, mode: str, lm_text, lm_speech, instruct: str | None):
        """(mode, LM prompt text, LM prompt speech): an instruction replaces the transcript and its speech. An LM that
        learnt without prompts (cadenza.json ``"lm_prompt": false``, the built-in model) gets neither: a clone's voice
        comes from the prompt audio (flow prompt, speaker embedding), its transcript is kept but not read. The built-in
        LM given one read the transcript again: 14 % of the words heard, 75 % without (docs/cadenza-tiny.md)."""
        if instruct is not None:
            mode, lm_text, lm_speech = "instruct2", self.engine.frontend.instruct_ids(instruct), None
        if not self.lm_prompt:
            lm_text = lm_speech = None
        return mode, lm_text, lm_speech

    def _check_args(self, text, text_ids, prompt_text, seed, speed) -> None:
        """Type and character checks of the arguments every synthesis entry point shares (before any work)."""
        if (text is None) == (text_ids is None):
            raise InputError("give exactly one of text or text_ids")
        if text is not None:
            check_text_arg(text, "text")
        else:
            check_ids(text_ids, "text_ids")
        check_prompt_text(prompt_text)
        check_seed(seed)
        check_speed(speed)

    def request(
        self,
        text: str | None = None,
        *,
        text_ids: Sequence[int] | None = None,
        prompt_wav: PromptAudio | None = None,
        prompt_text: str | None = None,
        prompt_text_ids: Sequence[int] | None = None,
        instruct: str | None = None,
        speaker: str | None = None,
        seed: int | None = None,
        speed: float = 1.0,
        normalize: bool = True,
        reference_wav: PromptAudio | None = None,
    ) -> SynthesisRequest:
        """Resolve arguments into one request (no splitting: see ``requests`` for long text). Modes:

        * ``prompt_wav`` + ``prompt_text``: zero-shot cloning (the transcript conditions the LM);
        * ``prompt_wav`` alone: cross-lingual cloning (voice only; use it when the transcript is unknown);
        * ``prompt_wav`` or ``speaker`` + ``instruct``: instruct2 (natural-language style instruction);
        * ``speaker``: a saved voice; nothing: an arbitrary voice (zero speaker embedding).

        ``reference_wav``: a recording whose voice to copy without its transcript, i.e. ``prompt_wav`` alone
        (cross-lingual); the name VoxCPM 2 models use for the same thing.
        """
        prompt_wav = reference_as_prompt(reference_wav, prompt_wav, prompt_text, prompt_text_ids)
        eng = self.engine
        self._check_args(text, text_ids, prompt_text, seed, speed)
        if text is not None and normalize:
            text = normalize_text(check_speakable(text))
            if prompt_text is not None and prompt_text.strip():
                prompt_text = normalize_text(prompt_text)
        ids = eng.frontend.text_ids(text) if text is not None else eng.check_text_ids(text_ids)
        voice, mode, lm_text, lm_speech = self._voice(prompt_wav, prompt_text, prompt_text_ids, instruct, speaker)
        return eng.build(text_ids=ids, voice=voice, mode=mode, lm_prompt_text=lm_text, lm_prompt_speech=lm_speech,
                         seed=seed, speed=speed)

    def segments(self, text: str, normalize: bool = True, max_tokens: int | None = None) -> list[str]:
        """Text -> normalised segments of at most ``max_tokens`` (default ``SEGMENT_TOKENS``, sized for BPE) tokens,
        cut at sentence, then clause ends. A tokenizer with a ``segment_tokens`` of its own (phonemes: ~3 per BPE
        token) counts in other units and has an LM that reads that many well: its own budget is used instead;
        one sentence per segment where it says its LM reads one at a time (``one_sentence_per_segment``:
        cadenza-tiny's phonemes)."""
        text = check_speakable(check_text_arg(text, "text"))
        if normalize:
            text = normalize_text(text)
        tokenizer = self.engine.frontend.tokenizer
        budget = getattr(tokenizer, "segment_tokens", None) or max_tokens or SEGMENT_TOKENS
        count = getattr(tokenizer, "count_piece", None) or (lambda s: len(tokenizer.encode(s)))
        pieces = split_text(text, budget, count_tokens=count,
                            one_sentence=self.engine.frontend.one_sentence_per_segment)
        pieces = [p for p in pieces if is_speakable(p)]
        if not pieces:
            raise TextError("text has nothing to speak after normalisation")
        return pieces

    def requests(self, text: str | None = None, **kwargs) -> list[SynthesisRequest]:
        """One request per text segment, all with the same voice (computed once). Segment k uses ``seed + k``. The
        arguments (``text_ids``, ``normalize``, the voice's, ``seed``, ``speed``) are ``request_batches``'."""
        return [r for batch in request_batches(self, text, **kwargs) for r in batch]

    def synthesize(self, text: str | None = None, *, progress: Callable[[int, int], None] | None = None,
                   input_format: str | None = None, lexicon=None, timestamps: bool = False, **kwargs) -> Audio:
        """Speak ``text`` (any length: it is normalised and split into segments; ``normalize=False`` keeps it as
        is), or ``text_ids=[...]`` when the model has no tokenizer files. Voice arguments: see ``request``.
        ``progress(done, total)`` is called after each segment. ``input_format="ssml"`` (or text that starts with
        ``<speak``) reads SSML, ``lexicon=`` applies a pronunciation lexicon (docs/text.md). ``timestamps=True``:
        ``Audio.words`` holds each word's start and end (docs/controls.md)."""
        if check_timestamps(timestamps):
            return with_words(self.synthesize(text, progress=progress, input_format=input_format, lexicon=lexicon,
                                              **kwargs), text)
        pieces = list(self.synthesize_iter(text, progress=progress, input_format=input_format, lexicon=lexicon,
                                           **kwargs))
        return Audio(np.concatenate(pieces) if pieces else np.zeros(0, np.float32), self.sample_rate)

    def synthesize_iter(self, text: str | None = None, *, progress: Callable[[int, int], None] | None = None,
                        input_format: str | None = None, lexicon=None, timestamps: bool = False,
                        **kwargs) -> Iterator[np.ndarray]:
        """``synthesize`` a segment at a time: each segment's audio in order as soon as it is done (the samples of
        ``synthesize``, not streamed), so a text of any length needs memory for a few segments only (``cadenza
        synth -o`` writes them to the file as they come). ``timestamps=True``: ``TimedChunk`` s."""
        if progress is not None and not callable(progress):  # before the work, not after its first segment
            raise InputError(f"progress must be a callable progress(done, total), not {type(progress).__name__}")
        if check_timestamps(timestamps):
            pieces = self.synthesize_iter(text, progress=progress, input_format=input_format, lexicon=lexicon, **kwargs)
            return timed_stream(pieces, text, self.sample_rate)
        if markup.wanted(self, text, input_format, lexicon, kwargs.get("speaker")):
            return markup.synthesize_iter(self, text, input_format=input_format, lexicon=lexicon, progress=progress,
                                          **kwargs)
        reqs = self.requests(text, **kwargs)
        on_segment = None if progress is None else (lambda done: progress(done, len(reqs)))
        return self.mark.stream(iterate_segments(self.engine.scheduler.submit, reqs, on_segment=on_segment))

    def synthesize_stream(self, text: str | Iterable[str] | None = None, *, input_format: str | None = None,
                          lexicon=None, timestamps: bool = False, **kwargs) -> Iterator[np.ndarray]:
        """Like ``synthesize`` but yields float32 chunks as soon as each is ready, across all segments
        (``timestamps=True``: ``TimedChunk`` s, each chunk with the word timings it settled; docs/controls.md).

        ``text`` may also be an iterable of text pieces (e.g. tokens streamed from an upstream LLM): the LM then
        interleaves text and speech as they arrive (bi-streaming) and audio starts before the text ends (an LM that
        reads one sentence at a time, the built-in's: each sentence once it is complete). Closing the returned
        generator cancels the request and frees its state.
        """
        if isinstance(text, (bytes, bytearray)) or not (text is None or isinstance(text, str)
                                                         or hasattr(text, "__iter__")):
            raise TextError(f"text must be a string or an iterable of strings, not {type(text).__name__}")
        if check_timestamps(timestamps):
            if text is None:
                raise InputError("timestamps need the text (not text_ids): timings are given for its words")
            return timed_text_stream(self.synthesize_stream, text, self.sample_rate, input_format=input_format,
                                     lexicon=lexicon, **kwargs)
        if text is None or isinstance(text, str):
            if markup.wanted(self, text, input_format, lexicon, kwargs.get("speaker")):
                return markup.synthesize_stream(self, text, input_format=input_format, lexicon=lexicon, **kwargs)
            if text is not None and len(text) > LAZY_PLAN_CHARS:  # a book: planned a block at a time as it is read
                return self.mark.stream(stream_long_text(self, text, **kwargs))
            return self.mark.stream(stream_segments(self.engine.scheduler.submit, self.requests(text, **kwargs)))
        kwargs.pop("normalize", None)  # pieces of a live text stream are spoken as they come
        pieces = markup.lexicon_pieces(self, iter(text), input_format, lexicon, kwargs.get("speaker"))
        return self.mark.stream(self._bistream(pieces, **kwargs))

    def _bistream(self, pieces: Iterator[str], *, prompt_wav=None, prompt_text=None, prompt_text_ids=None,
                  instruct=None, speaker=None, seed=None, speed: float = 1.0,
                  reference_wav=None, **unknown) -> Iterator[np.ndarray]:
        refuse_unknown(unknown, "synthesize_stream of text pieces", STREAMED_TEXT_ARGUMENTS)
        prompt_wav = reference_as_prompt(reference_wav, prompt_wav, prompt_text, prompt_text_ids)
        check_seed(seed)
        speed = check_speed(speed)
        voice, mode, lm_text, lm_speech = self._voice(prompt_wav, prompt_text, prompt_text_ids, instruct, speaker)
        stream = cosyvoice2_text_stream(self.engine, self.segments, voice, mode, lm_text, lm_speech, seed, speed)
        feed_in_background(pieces, stream, self.speakable)
        return iter(stream)

    def convert_voice(self, source_wav: PromptAudio, prompt_wav: PromptAudio | None = None, seed: int | None = None,
                      *, speaker: str | None = None, source_text: str | None = None, timestamps: bool = False) -> Audio:
        """Voice conversion: say what ``source_wav`` says in another voice (no LM): that of ``prompt_wav``, of the
        saved ``speaker``, or, with neither, the model's default voice (the built-in model: joe).

        ``source_text``: what ``source_wav`` says, for a model whose speech tokens are phonemes (the built-in one): its
        tokens are then placed by alignment with the text, which keeps the words of a voice its tokenizer never heard
        (docs/cadenza-tiny.md). Up to 300 s of source (past 30 s read in windows, rendered chunk by chunk).
        ``timestamps=True`` (with ``source_text``): ``Audio.words`` times its words in the output (docs/controls.md)."""
        if check_timestamps(timestamps) and source_text is None:
            raise InputError("timestamps of a voice conversion need source_text: the words timed are its words")
        req = conversion.convert_voice_request(self, source_wav, prompt_wav, speaker=speaker, source_text=source_text,
                                               seed=seed)
        whole = conversion.renders_whole(req)
        audio = self.engine.synthesize(req) if whole else np.concatenate(list(self.engine.stream(req)))
        out = Audio(self.mark.whole(audio), self.sample_rate)
        return with_words(out, source_text) if timestamps else out

    def live_conversion(self, sample_rate: int, prompt_wav: PromptAudio | None = None, seed: int | None = None, *,
                        speaker: str | None = None, voice: Voice | None = None,
                        max_seconds: float = conversion.MAX_SOURCE_SECONDS) -> LiveConversion:
        """Voice conversion of a source as it is recorded (``api/live_conversion.py``): ``push`` its samples at
        ``sample_rate``, ``end()``, iterate the chunks. The target as ``convert_voice``'s, or a store's ``voice``."""
        target = conversion.conversion_target(self, prompt_wav, speaker, voice)
        return conversion.live_conversion(self, target, sample_rate, seed=seed, max_seconds=max_seconds)

    def convert_voice_stream(self, source_wav: PromptAudio, prompt_wav: PromptAudio | None = None,
                             seed: int | None = None, *, speaker: str | None = None,
                             source_text: str | None = None) -> Iterator[np.ndarray]:
        """``convert_voice`` as float32 chunks as soon as each is made (the flow chunk by chunk, as the server streams
        it; under 30 s not the samples of the whole-utterance flow). Closing the iterator cancels the rest."""
        req = conversion.convert_voice_request(self, source_wav, prompt_wav, speaker=speaker, source_text=source_text,
                                               seed=seed)
        return self.mark.stream(stream_segments(self.engine.scheduler.submit, [req]))

    # -- serving (cadenza.api.protocol.SpeechModel) ------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        frontend = self.engine.frontend
        instruct = frontend is None or not frontend.reads_phonemes  # a phoneme reader was not trained with them
        return Capabilities(
            family=self.family, title="CosyVoice 2", sample_rate=self.sample_rate,
            modes=("zero_shot", "cross_lingual", "speaker", *(("instruct",) if instruct else ()), "voice_conversion"),
            instructions="instruct" if instruct else "none", speed=(0.5, 2.0), cloning_modes=(),
            text_streaming="sentences" if self.engine.frontend.one_sentence_per_segment else "tokens",
            default_voice=self.default_speaker is not None,
            output_frame_samples=self.engine.token2wav.hop)

    def prompt_library(self, store: VoiceStore, cache_size: int = 64) -> CosyVoice2Prompts:
        """Saved voices of ``store`` as this model's prompts (the API's own library when it is the same store)."""
        if store is self.voices and self.voice_prompts is not None:
            return self.voice_prompts
        return CosyVoice2Prompts(self, store, cache_size)

    def speakable(self, text: str) -> bool:
        """Whether ``text`` has something to speak (not only marks, spaces or tags the model cannot perform)."""
        return self.engine.frontend.speakable(text)

    def _conditioning(self, voice: Voice | None, instructions: str | None):
        """(prompt, mode, LM prompt text, LM prompt speech) of a resolved voice, as ``_voice`` resolves a speaker;
        ``None``: the model's default speaker."""
        eng = self.engine
        if voice is None:
            if self.default_speaker is None:
                raise UnknownSpeakerError("this model has no default voice: name a saved voice")
            voice = Voice(eng.speakers.get(self.default_speaker), self.default_speaker, "speaker")
        prompt, mode = voice.prompt, voice.mode
        lm_text = prompt.prompt_text
        lm_speech = None if mode == "cross_lingual" else prompt.llm_prompt_speech
        if instructions is not None:
            check_text_arg(instructions, "instructions", max_chars=MAX_INSTRUCTIONS_CHARS)
        return (prompt, *self._lm_conditioning(mode, lm_text, lm_speech, instructions))

    def plan(self, segments: Sequence[str], voice: Voice | None, *, instructions: str | None = None,
             seed: int | None = None, speed: float = 1.0) -> Plan:
        """One request per segment (from ``segments``), all with ``voice``; segment k uses ``seed + k``."""
        check_seed(seed)
        check_speed(speed)
        prompt, mode, lm_text, lm_speech = self._conditioning(voice, instructions)
        eng = self.engine
        requests, n_text = [], 0
        for i, segment in enumerate(segments):
            ids = eng.frontend.text_ids(segment)
            n_text += ids.shape[1]
            requests.append(eng.build(text_ids=ids, voice=prompt, mode=mode, lm_prompt_text=lm_text,
                                      lm_prompt_speech=lm_speech, seed=seed_at(seed, i),
                                      speed=speed))
        return Plan(requests, n_text)

    def conversion_plan(self, source: PromptAudio, voice: Voice | None, *, source_text: str | None = None,
                        seed: int | None = None, max_seconds: float = conversion.MAX_SOURCE_SECONDS) -> Plan:
        """Voice conversion as a plan (the server's ``POST /v1/audio/voice-conversion``): one request saying what
        ``source`` says in ``voice`` (``None``: the default voice); ``convert_voice`` for the rest."""
        prompt = self._conditioning(voice, None)[0]
        return Plan([conversion.conversion_request(
            self.engine.frontend, self.source_aligner, source, prompt, source_text=source_text, seed=seed,
            sample_rate=self.sample_rate, max_seconds=max_seconds, capacity=self.engine.speech_capacity(prompt))], 0)

    def submit(self, request: SynthesisRequest, stream: bool = True):
        return self.engine.scheduler.submit(request, stream=stream)

    def open_text_stream(self, voice: Voice | None, *, instructions: str | None = None,
                         seed: int | None = None, speed: float = 1.0) -> TokenTextStream | SentenceTextStream:
        """Text fed piece by piece (``feed``/``end``), spoken as it goes: a bi-streaming request whose LM reads the
        pieces as they come, or a sentence at a time for an LM that reads one at a time (``cosyvoice2_text_stream``)."""
        check_seed(seed)
        speed = check_speed(speed)
        prompt, mode, lm_text, lm_speech = self._conditioning(voice, instructions)
        return cosyvoice2_text_stream(self.engine, self.segments, prompt, mode, lm_text, lm_speech, seed, speed)

    @property
    def load(self) -> tuple[int, int]:
        """(active, queued) requests of the engine's scheduler."""
        return self.engine.scheduler.load

    @property
    def limits(self) -> SchedulerConfig:
        return self.engine.scheduler.config

    def close(self) -> None:
        """Stop the engine's worker thread (pending requests are cancelled); close the voice store it opened."""
        self.engine.close()
        if self._owns_voices:
            self.voices.close()

    def __enter__(self) -> Cadenza:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
