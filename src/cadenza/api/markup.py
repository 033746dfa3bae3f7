"""SSML and pronunciation lexicons for every model family: text -> a ``Script`` of runs and pauses -> requests.

::

    script = make_script(tts, '<speak>Hi <break time="250ms"/> there</speak>', lexicon=Lexicon.from_file("lex.json"))
    # [Run(segments=['Hi'], speed=1.0), Pause(250.0), Run(segments=['there'], speed=1.0)]

A ``Run`` is text spoken with one rate and language, already normalised and split into the model's segments
(``SpeechModel.segments``); a ``Pause`` becomes a ``Silence`` of ``round(ms * sample_rate / 1000)`` zero samples
among the engine requests (``cadenza.engine.silence``), so streamed and whole outputs hold the same exact silence.
The Python API (``synthesize(..., input_format=, lexicon=)``) and the server (``input_format``, ``lexicon``) both
come through here; plain text without a lexicon keeps its usual path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cadenza.api.arguments import (
    SYNTHESIS_ARGUMENTS,
    check_flag,
    check_prompt_text,
    check_seed,
    check_speed,
    check_text_arg,
    reference_as_prompt,
    refuse_unknown,
    seed_at,
)
from cadenza.engine.long_form import iterate_segments, stream_segments
from cadenza.engine.silence import Silence, marked_chunks, with_silences
from cadenza.errors import InputError, TextError
from cadenza.text.lexicon import Lexicon
from cadenza.text.lexicon_stream import LexiconStream
from cadenza.text.normalize import normalize as normalize_text
from cadenza.text.ssml import FrontendTraits, Pause, Spoken, looks_like_ssml, parse_ssml, ssml_start

INPUT_FORMATS = ("text", "ssml")
SSML_IN_PIECES = ("SSML is read as one whole document{}: give it as one string, not as pieces (cadenza synth: "
                  "without --text-stream; over the WebSocket each input.text is one whole document)")
MAX_UNDECIDED_CHARS = 4096  # pieces held back to tell whether streamed text is SSML (spaces, an <?xml ...?>)
LexiconLike = Lexicon | dict | list | str | os.PathLike | None


@dataclass(frozen=True)
class Run:
    """Normalised segments spoken at ``speed``."""

    segments: list[str]
    speed: float = 1.0


Script = list[Run | Pause]


def check_input_format(value: object) -> str | None:
    if value is None or value in INPUT_FORMATS:
        return value
    raise InputError(f"input_format must be 'text' or 'ssml' (or left out: SSML is recognised by a leading "
                     f"<speak>), not {str(value)[:40]!r}")


def as_lexicon(value: LexiconLike) -> Lexicon | None:
    """A ``Lexicon``, its JSON form (a list of entries or ``{"entries": [...]}``, parsed or as a string) or the path
    of a JSON file."""
    if value is None or isinstance(value, Lexicon):
        return value
    if isinstance(value, (dict, list)):
        return Lexicon.from_json(value)
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):  # the JSON itself, not a file name
        return Lexicon.from_text(value)
    if isinstance(value, (str, os.PathLike)):
        return Lexicon.from_file(Path(value))
    raise InputError(f"lexicon must be a cadenza.text.lexicon.Lexicon, a list of entries, {{'entries': [...]}} "
                     f"or a JSON file's path, not {type(value).__name__}")


def is_ssml(text: object, input_format: str | None) -> bool:
    fmt = check_input_format(input_format)
    return fmt == "ssml" or (fmt is None and looks_like_ssml(text))


def traits_of(tts) -> FrontendTraits:
    """What ``tts``'s text frontend does with markup (emphasis tags, phonemes, languages, speaking rates)."""
    rate = tts.capabilities.speed
    if tts.family == "cosyvoice2":
        tokenizer = tts.engine.frontend.tokenizer
        table = getattr(tokenizer, "table", None)
        if table is not None:  # reads espeak-ng phonemes (cadenza-tiny): no emphasis tags, its one language
            language = "zh" if table.language.startswith(("zh", "cmn")) else "en"
            return FrontendTraits(phonemes=frozenset(table.symbols), languages=(language,), rate=rate)
        return FrontendTraits(emphasis=("<strong>", "</strong>"), rate=rate)
    return FrontendTraits(rate=rate)  # VoxCPM 2: no emphasis tags, no phoneme input


def _split_description(tts, text: str) -> tuple[str, str]:
    """VoxCPM 2's leading ``(description)`` (kept for every run) and the rest."""
    if tts.family != "voxcpm2":
        return "", text
    from cadenza.models.voxcpm2.request_text import split_description

    description, spoken = split_description(text)
    return ("" if description is None else f"({description})"), spoken


def make_script(tts, text: str, *, input_format: str | None = None, lexicon: Lexicon | None = None,
                normalize: bool = True, max_tokens: int | None = None, speed: float = 1.0) -> Script:
    """``text`` (SSML or plain) -> runs of normalised segments and pauses. ``InputError`` naming the tag and its
    position for SSML the model cannot take; ``TextError`` when nothing is left to speak."""
    check_text_arg(text, "text")
    traits = traits_of(tts)
    if is_ssml(text, input_format):
        pieces = parse_ssml(text, traits, lexicon)
    else:
        pieces = [Spoken(lexicon.apply(text, traits.phonemes) if lexicon else text)]
    first = next(i for i, p in enumerate(pieces) if isinstance(p, Spoken))
    head, rest = _split_description(tts, pieces[first].text)
    if head:
        pieces[first] = Spoken(rest, pieces[first].rate, pieces[first].lang)
    script: Script = []
    for piece in pieces:
        if isinstance(piece, Pause):
            script.append(piece)
            continue
        spoken = normalize_text(piece.text, lang=piece.lang) if normalize else piece.text
        if not tts.speakable(head + spoken):
            continue  # e.g. the full stop after a break
        rate, limits = piece.rate * speed, tts.capabilities.speed
        if rate != 1.0 and limits is not None and not limits[0] <= rate <= limits[1]:
            raise InputError(f"<prosody rate> {piece.rate:g} at speed {speed:g} is a speaking rate of {rate:g}; this "
                             f"model speaks at {limits[0]:g} to {limits[1]:g} ({spoken[:40]!r})")
        script.append(Run(tts.segments(head + spoken, normalize=False, max_tokens=max_tokens), rate))
    if not any(isinstance(item, Run) for item in script):
        raise TextError("text has nothing to speak after normalisation")
    return script


def script_text(script: Script) -> list[str]:
    """Every segment of the script, in order (for length bounds and accounting)."""
    return [s for item in script if isinstance(item, Run) for s in item.segments]


def pause_seconds(script: Script) -> float:
    return sum(item.ms for item in script if isinstance(item, Pause)) / 1000.0


def plan_script(tts, script: Script, voice, *, instructions: str | None = None, seed: int | None = None,
                **options) -> tuple[list, int]:
    """(engine requests and ``Silence`` items in order, text tokens) through ``SpeechModel.plan`` (the server's
    path; ``options`` go to it as they are); segment k of the whole script uses ``seed + k`` as a plain request
    would."""
    items: list = []
    n_text = k = 0
    for item in script:
        if isinstance(item, Pause):
            items.append(Silence(item.samples(tts.sample_rate)))
            continue
        plan = tts.plan(item.segments, voice, instructions=instructions, seed=seed_at(seed, k),
                        speed=item.speed, **options)
        items += plan.requests
        n_text += plan.text_tokens
        k += len(item.segments)
    return items, n_text


class LexiconTextStream:
    """A ``TextStream`` (``SpeechModel.open_text_stream``) whose pieces go through a lexicon first
    (``LexiconStream``: each word is passed on once no later piece can change how it is said)."""

    def __init__(self, inner, lexicon: Lexicon, phonemes=None) -> None:
        self.inner, self.lexicon = inner, LexiconStream(lexicon, phonemes)

    def feed(self, text: str) -> None:
        if ready := self.lexicon.feed(text):
            self.inner.feed(ready)

    def end(self) -> None:
        if rest := self.lexicon.flush():
            self.inner.feed(rest)
        self.inner.end()

    def fail(self, exc: BaseException) -> None:
        self.inner.fail(exc)

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.inner)

    def cancel(self) -> None:
        self.inner.cancel()


def with_lexicon(tts, text_stream, lexicon: Lexicon | None):
    """``text_stream`` with ``lexicon`` applied to its pieces as ``tts``'s frontend reads them (phoneme entries for
    models that read phonemes); itself when there is no lexicon."""
    if not lexicon:
        return text_stream
    return LexiconTextStream(text_stream, lexicon, traits_of(tts).phonemes)


def lexicon_pieces(tts, pieces: Iterator[str], input_format: str | None, lexicon: LexiconLike,
                   speaker: object) -> Iterator[str]:
    """Text pieces of a bi-stream (``synthesize_stream`` over an iterator) with ``lexicon`` (over the saved voice
    ``speaker``'s own) applied as they come. SSML cannot come in pieces (it is parsed as one whole document):
    ``input_format="ssml"`` is an ``InputError``, and so are pieces that start as SSML does (``refusing_ssml``;
    ``input_format="text"`` reads them as plain text)."""
    fmt = check_input_format(input_format)
    if fmt == "ssml":
        raise InputError(SSML_IN_PIECES.format(""))
    if fmt is None:
        pieces = refusing_ssml(pieces)
    lexicon = as_lexicon(lexicon)
    saved = voice_lexicon(tts.voices, speaker)
    lexicon = saved if lexicon is None else lexicon.over(saved)
    if not lexicon:
        return pieces
    stream = LexiconStream(lexicon, traits_of(tts).phonemes)

    def respelled() -> Iterator[str]:
        for piece in pieces:
            if not isinstance(piece, str):
                yield piece  # the bi-stream's own check names it
            elif ready := stream.feed(piece):
                yield ready
        if rest := stream.flush():
            yield rest

    return respelled()


def refusing_ssml(pieces: Iterator[str]) -> Iterator[str]:
    """``pieces`` as they come, the first ones held back only until they tell whether the text starts as SSML (the
    rule of ``looks_like_ssml``: a leading ``<speak``): SSML is an ``InputError`` before any of it is spoken, where
    its tags would otherwise be read aloud. The error reaches the consumer as the stream's (the pieces are read on
    the feeding thread)."""
    held: list = []
    pieces = iter(pieces)
    for piece in pieces:
        held.append(piece)
        if not isinstance(piece, str):
            break  # the bi-stream's own check names it
        text = "".join(held)
        start = ssml_start(text)
        if start:
            raise InputError(SSML_IN_PIECES.format(", and these text pieces start with <speak>"))
        if start is False or len(text) > MAX_UNDECIDED_CHARS:  # past that, spaces or <?xml: not looked at
            break
    else:  # the pieces ended before they told: they are the whole text
        if looks_like_ssml("".join(held)):
            raise InputError(SSML_IN_PIECES.format(", and these text pieces start with <speak>"))
    yield from held
    yield from pieces


def voice_lexicon(store, speaker: object) -> Lexicon | None:
    """The lexicon saved with the store's voice ``speaker`` (by id or name), or None."""
    if store is None or not isinstance(speaker, str):
        return None
    from cadenza.voices.lexicons import lexicons_of

    return lexicons_of(store).lexicon_of(speaker)


def wanted(tts, text: object, input_format: str | None, lexicon: LexiconLike, speaker: object) -> bool:
    """Whether a call goes through SSML / lexicon handling: SSML, a lexicon, or a saved voice that has one."""
    return is_ssml(text, input_format) or lexicon is not None or voice_lexicon(tts.voices, speaker) is not None


# -- the Python API ------------------------------------------------------------------------------------------------
def _cosyvoice2_requests(tts, script: Script, *, seed=None, prompt_wav=None, prompt_text=None,
                         prompt_text_ids=None, instruct=None, speaker=None, reference_wav=None,
                         normalize: bool = True, **unknown) -> list:
    refuse_unknown(unknown, "synthesis", SYNTHESIS_ARGUMENTS)
    check_flag(normalize, "normalize")
    prompt_wav = reference_as_prompt(reference_wav, prompt_wav, prompt_text, prompt_text_ids)
    check_seed(seed)
    check_prompt_text(prompt_text)
    if normalize and prompt_text is not None and prompt_text.strip():
        prompt_text = normalize_text(prompt_text)
    # The voice once for all runs, exactly as ``Cadenza.requests`` resolves it.
    voice, mode, lm_text, lm_speech = tts._voice(prompt_wav, prompt_text, prompt_text_ids, instruct, speaker)
    eng, items, k = tts.engine, [], 0
    for item in script:
        if isinstance(item, Pause):
            items.append(Silence(item.samples(tts.sample_rate)))
            continue
        for segment in item.segments:
            items.append(eng.build(text_ids=eng.frontend.text_ids(segment), voice=voice, mode=mode,
                                   lm_prompt_text=lm_text, lm_prompt_speech=lm_speech,
                                   seed=seed_at(seed, k), speed=item.speed))
            k += 1
    return items


def _voxcpm2_requests(tts, script: Script, **kwargs) -> list:
    return next(voxcpm2_request_batches(tts, iter([script]), **kwargs))


def voxcpm2_request_batches(tts, scripts: Iterator[Script], *, seed=None, speaker=None, reference_wav=None,
                            prompt_wav=None, prompt_text=None, normalize: bool = True, **options) -> Iterator[list]:
    """Each script's requests and silences, in turn (a long text planned a block at a time: ``api/voxcpm2.py``): the
    voice is resolved once, with the first; segment k of them all uses ``seed + k``."""
    check_seed(seed)
    check_prompt_text(prompt_text)
    voice = options.pop("voice", None)
    if speaker is not None:
        if any(a is not None for a in (reference_wav, prompt_wav, prompt_text, voice)):
            raise InputError("give either speaker (a saved voice) or voice audio, not both")
        voice = tts._saved_voice(speaker)
    elif reference_wav is not None or prompt_wav is not None:  # the prompt once for all runs
        voice = tts.engine.voice(reference_wav=reference_wav, prompt_wav=prompt_wav, prompt_text=prompt_text)
    k = 0
    for script in scripts:
        items = []
        for item in script:
            if isinstance(item, Pause):
                items.append(Silence(item.samples(tts.sample_rate)))
                continue
            for segment in item.segments:
                rate = {} if item.speed == 1.0 else {"speed": item.speed}
                items.append(tts.request(segment, seed=None if seed is None else (seed + k) % 2**62,
                                         normalize=False, voice=voice, **rate, **options))
                k += 1
        yield items


def _items(tts, text, input_format, lexicon, kwargs: dict, segments: list[str] | None = None) -> list:
    if kwargs.get("text_ids") is not None:
        raise InputError("text_ids cannot be combined with SSML or a lexicon: give the text")
    kwargs.pop("text_ids", None)
    lexicon = as_lexicon(lexicon)
    saved = voice_lexicon(tts.voices, kwargs.get("speaker"))
    lexicon = saved if lexicon is None else lexicon.over(saved)
    normalize = kwargs.get("normalize", True)
    speed = check_speed(kwargs.pop("speed", 1.0))  # times each run's <prosody rate>
    script = (make_script(tts, text, input_format=input_format, lexicon=lexicon, normalize=normalize, speed=speed)
              if segments is None else [Run(segments, speed)])
    if tts.family == "cosyvoice2":
        return _cosyvoice2_requests(tts, script, **kwargs)
    return _voxcpm2_requests(tts, script, **kwargs)


def synthesize_iter(tts, text: str, *, input_format: str | None = None, lexicon: LexiconLike = None,
                    progress: Callable[[int, int], None] | None = None, segments: list[str] | None = None,
                    **kwargs) -> Iterator[np.ndarray]:
    """``tts.synthesize_iter`` of SSML or with a lexicon, or of ``segments`` the caller already cut plain text into:
    each segment's (or break's) audio in order; closing the iterator frees what is in flight."""
    items = _items(tts, text, input_format, lexicon, kwargs, segments)
    on_segment = None if progress is None else (lambda done: progress(done, len(items)))
    return marked_chunks(iterate_segments(with_silences(tts.submit), items, window=4, on_segment=on_segment),
                         tts.mark.embedder())


def synthesize_stream(tts, text: str, *, input_format: str | None = None, lexicon: LexiconLike = None,
                      segments: list[str] | None = None, **kwargs) -> Iterator[np.ndarray]:
    """``tts.synthesize_stream`` of SSML or with a lexicon: chunks as they are made, each break one chunk of
    zeros; closing the iterator frees what is in flight."""
    items = _items(tts, text, input_format, lexicon, kwargs, segments)
    return marked_chunks(stream_segments(with_silences(tts.submit), items), tts.mark.embedder())
