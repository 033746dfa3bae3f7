"""``/v1/audio/speech/stream``: bi-streaming over a WebSocket -- text in as it is written, audio out as it is made.

Protocol (JSON text messages, audio as binary messages), one utterance per connection::

    client: {"type": "session.config", "model"?: str, "voice"?: "alice" | {"id": ...}, "instructions"?: str,
             "seed"?: int, "lora"?: str, "speed"?: 0.5-2.0, "timestamps"?: bool, "input_format"?: "text" | "ssml",
             "lexicon"?: [{"word", "respelling" | "phonemes", "case_sensitive"?}, ...]}
    server: {"type": "audio.start", "sample_rate": 24000, "format": "pcm_s16le", "seed": ...}
    client: {"type": "input.text", "text": "Hello ", "input_format"?: ..., "lexicon"?: [...]}   (any number)
    client: {"type": "input.done"}
    server: binary frames of 16-bit little-endian mono PCM, as soon as each chunk is ready
    server: {"type": "word", "word": "Hello", "start": 0.04, "end": 0.28, "start_char": 0, "end_char": 5}
            (with ``"timestamps": true`` in session.config: each word once its timing is settled, after the audio
            it lies in; docs/controls.md, "Word timestamps")
    server: {"type": "audio.done", "audio_seconds": ..., "first_chunk_seconds": ...}, then closes (1000)

Errors: ``{"type": "error", "error": {"message", "type", "param", "code"}, "fatal": true}``, then the server closes
(1007 bad message, 1008 not authorised, 1011 server error, 1013 busy); ``"fatal": false``: one SSML document was
refused (its SSML, or its lexicon entries: the HTTP 400's code and wording) and the session goes on without it.

SSML and lexicons (docs/server.md, "WebSocket protocol"): a session speaks either streamed text or SSML documents,
decided by its first text with something in it (``input_format`` of that message or of the session; left out, a
text starting with ``<speak`` is SSML). In an SSML session every ``input.text`` is one whole ``<speak>`` document,
planned exactly as ``POST /v1/audio/speech`` plans one (``markup_api.plan_document``: breaks are exact zeros) and
spoken after the documents before it (document *k* with seed + 1000·*k*). A lexicon (``session.config``'s entries
over the saved voice's own) applies to streamed text as it arrives (``LexiconStream``) and to every document; a
document's own ``lexicon`` entries apply to it alone. The pieces go to the model's text stream
(``SpeechModel.open_text_stream``): CosyVoice 2 tokenizes them as they arrive for its bi-streaming LM, so audio starts
a few words in; VoxCPM 2 speaks each sentence once it is complete. The engine request (and an admission slot) is taken only when the text so far has something to speak, and
only text with something in it moves the idle deadline (``ws_idle_timeout_s``); a session lasts at most
``ws_max_session_s``. A client that disconnects or times out cancels the request and frees its engine state.

The messages, close codes and deadlines are in ``ws_protocol.py``; this file runs the sessions.
"""

from __future__ import annotations

import logging
import secrets
import time

import anyio
from fastapi import APIRouter, WebSocket

from cadenza.alignment.timer import WordTimer
from cadenza.alignment.words import without_markup
from cadenza.api import markup
from cadenza.api.arguments import check_chars
from cadenza.audio.wav_stream import pcm16
from cadenza.engine.long_form import SegmentStream
from cadenza.engine.silence import keep_silence, with_silences
from cadenza.errors import InputError, TextError
from cadenza.server.engine_stream import SEGMENTS_IN_FLIGHT, EngineStream, Slot
from cadenza.server.errors import APIError
from cadenza.server.fields import voice_ref
from cadenza.server.markup_api import parse_lexicon, plan_document
from cadenza.server.openai_voices import request_voice
from cadenza.server.state import ServedModel, ServerState
from cadenza.server.ws_protocol import (
    CLOSE_BAD_DATA,
    CLOSE_BUSY,
    Deadlines,
    SessionClosed,
    SessionConfig,
    bad_message,
    close_code,
    deliver,
    input_error_close,
    receive_config,
    receive_json,
    send_error,
    serve_session,
)
from cadenza.text.duration import estimate_speech_seconds
from cadenza.text.lexicon import Lexicon
from cadenza.text.ssml import looks_like_ssml

log = logging.getLogger(__name__)
WS_PATH = "/v1/audio/speech/stream"
# The fields of each client message after session.config (an unknown one is refused, as in session.config).
MESSAGE_KEYS = {"input.text": {"type", "text", "input_format", "lexicon"}, "input.done": {"type"}}

router = APIRouter()


@router.websocket(WS_PATH)
async def speech_stream(ws: WebSocket) -> None:
    await serve_session(ws, WS_PATH, _session)


async def _session(ws: WebSocket, state: ServerState) -> None:
    cfg = state.config
    deadlines = Deadlines(cfg.ws_idle_timeout_s, cfg.ws_max_session_s)
    config = await receive_config(ws, deadlines, SessionConfig)
    seed = config.seed if config.seed is not None else secrets.randbits(62)
    instructions = config.instructions if config.instructions and config.instructions.strip() else None
    try:
        served, lora = state.route(config.model, config.lora)
    except APIError as exc:
        raise SessionClosed(CLOSE_BAD_DATA, exc) from exc
    try:
        ref = None if config.voice is None else voice_ref(config.voice)
        # Only that the voice exists: no slot, no feature work until there is text to speak.
        if ref is not None:
            ref = await anyio.to_thread.run_sync(request_voice, served, ref, limiter=state.limiter)
        elif not served.capabilities.default_voice:
            raise APIError(400, "this model has no default voice: name a saved voice in session.config",
                           param="voice", code="missing_field")
    except Exception as exc:
        error = state.error(exc, param="voice")
        raise SessionClosed(close_code(error, exc), error) from exc
    try:  # the session's entries over the saved voice's own, as a request's are
        own = parse_lexicon(config.lexicon)
        saved = None if ref is None else await anyio.to_thread.run_sync(markup.voice_lexicon, state.voices, ref,
                                                                         limiter=state.limiter)
    except APIError as exc:
        raise SessionClosed(CLOSE_BAD_DATA, exc) from exc
    # Refused before audio.start: a session that is told it started is one the client may stream text into.
    try:
        served.check_instructions(instructions)
    except APIError as exc:
        raise SessionClosed(CLOSE_BAD_DATA, exc) from exc
    rates = served.capabilities.speed
    if config.speed != 1.0 and (rates is None or not rates[0] <= config.speed <= rates[1]):
        raise bad_message(f"speed {config.speed:g} is outside what this model supports "
                   f"({'1.0 only' if rates is None else f'{rates[0]:g} to {rates[1]:g}'})", "speed")
    await deliver(ws.send_json({"type": "audio.start", "sample_rate": served.sample_rate, "format": "pcm_s16le",
                              "seed": seed}))
    synthesis = _Synthesis(state, served, ref, instructions, seed, lora)
    synthesis.speed = config.speed
    synthesis.input_format = config.input_format
    synthesis.lexicon = saved if own is None else own.over(saved)
    if config.timestamps:
        synthesis.timer = await anyio.to_thread.run_sync(WordTimer, None, served.sample_rate, limiter=state.limiter)
    try:
        await _run(ws, state, synthesis, deadlines)
    finally:
        synthesis.close()


class _Synthesis:
    """The engine side of a session, started only once there is text to speak (then it holds an admission slot).

    Until then a session costs nothing but its connection: a client that sends only its config, or empty pieces,
    cannot pin engine slots.
    """

    def __init__(self, state: ServerState, served: ServedModel, ref: str | None, instructions: str | None,
                 seed: int, lora: str | None = None) -> None:
        self.state, self.served, self.ref, self.instructions, self.seed = state, served, ref, instructions, seed
        self.lora = lora
        self.slot: Slot | None = None
        self.handle = None
        self.stream: EngineStream | None = None
        self.started = anyio.Event()
        self.seconds = 0.0  # estimated audio of the text so far
        self.timer: WordTimer | None = None  # word timestamps, when the session asked for them
        self.speed = 1.0
        self.input_format: str | None = None  # session.config's
        self.lexicon: Lexicon | None = None  # the session's entries over the voice's
        self.ssml: bool | None = None  # decided by the first text with something in it
        self.documents = 0  # SSML documents accepted so far

    def plan_document(self, text: str, entries: list | None) -> tuple[list, float]:
        """One SSML document -> (engine requests and ``Silence`` items, estimated seconds), as HTTP plans one; its
        own ``entries`` over the session's lexicon. Blocking. ``APIError``: the document (or its entries) is bad."""
        lexicon = self.lexicon if entries is None else parse_lexicon(entries).over(self.lexicon)
        items, _, seconds = plan_document(self.state, self.served, text, input_format="ssml", lexicon=lexicon,
                                          voice=self.ref, instructions=self.instructions, speed=self.speed,
                                          seed=(self.seed + 1000 * self.documents) % 2**62, lora=self.lora,
                                          param="text")
        return items, seconds

    async def start(self, seconds: float) -> None:
        state = self.state
        try:
            self.slot = state.admission.acquire(seconds)
        except APIError as exc:
            raise SessionClosed(CLOSE_BUSY, exc) from exc
        self.seconds = seconds

        served = self.served

        def start():
            if self.ssml:  # documents arrive planned (``plan_document``) and are spoken one after the other
                return SegmentStream(with_silences(served.tts.submit), [], SEGMENTS_IN_FLIGHT, open_ended=True)
            voice = None if self.ref is None else served.prompts.resolve(self.ref, reveal_names=False)
            adapter = {} if self.lora is None else {"lora": self.lora}  # only models that take adapters get it
            rate = {} if self.speed == 1.0 else {"speed": self.speed}
            stream = served.tts.open_text_stream(voice, instructions=self.instructions, seed=self.seed, **adapter,
                                                 **rate)
            return markup.with_lexicon(served.tts, stream, self.lexicon)

        try:
            self.handle = await anyio.to_thread.run_sync(start, limiter=state.limiter)
        except Exception as exc:
            error = state.error(exc, param="voice")
            raise SessionClosed(close_code(error, exc), error) from exc
        self.stream = EngineStream(served.tts.submit, [], limiter=state.limiter, handle=self.handle,
                                   max_samples=int(state.config.max_audio_seconds * served.sample_rate),
                                   mark=keep_silence(served.tts.mark.embedder()))  # breaks stay exact zeros
        self.started.set()

    def grow(self, seconds: float) -> None:
        """Count more estimated audio against admission (429-like close when the server has no room)."""
        try:
            self.slot.grow(seconds - self.seconds)
        except APIError as exc:
            raise SessionClosed(CLOSE_BUSY, exc) from exc
        self.seconds = max(self.seconds, seconds)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        elif self.handle is not None:
            self.handle.cancel()
        if self.slot is not None:
            self.slot.release()


async def _run(ws: WebSocket, state: ServerState, synthesis: _Synthesis, deadlines: Deadlines) -> None:
    cfg = state.config
    tts = synthesis.served.tts
    times: dict[str, float] = {}
    outcome: list[BaseException] = []
    pending: list[str] = []  # text received before the engine started
    sending = anyio.Lock()  # audio and words go out from send(), a refused document's error from receive()
    refused: list[APIError] = []  # SSML documents refused (the session went on without them)

    async def feed(text: str) -> None:
        if not text:
            return
        if synthesis.handle is None:
            pending.append(text)
            return
        try:  # off the event loop: a model may plan a sentence's request here
            await anyio.to_thread.run_sync(synthesis.handle.feed, text, limiter=state.limiter)
        except InputError as exc:
            raise input_error_close(exc) from exc
        except APIError:
            raise
        except Exception as exc:
            error = state.error(exc, param="text")
            raise SessionClosed(close_code(error, exc), error) from exc

    async def begin(seconds: float) -> None:
        """Start the engine (first speakable text) or count more work; ``seconds``: the text so far, estimated."""
        if seconds > cfg.max_audio_seconds:
            raise SessionClosed(CLOSE_BAD_DATA, APIError(
                400, f"the text would make about {seconds:.0f} s of audio; one session may make at most "
                f"{cfg.max_audio_seconds:g} s", param="text", code="audio_above_max_duration"))
        if synthesis.handle is None:
            await synthesis.start(max(seconds, 1.0))
            text, pending[:] = "".join(pending), []
            await feed(text)  # (none in an SSML session: its documents are added planned)
        else:
            synthesis.grow(seconds)

    async def document(text: str, entries: object, seconds: float) -> float:
        """An SSML session's document: planned, then spoken after the ones before; refused alone when its SSML or
        its lexicon entries are bad (the session goes on). Returns the session's estimated seconds with it."""
        if entries is not None and not isinstance(entries, list):
            raise bad_message("lexicon must be a list of entries", "lexicon")
        try:
            items, more = await anyio.to_thread.run_sync(synthesis.plan_document, text, entries,
                                                         limiter=state.limiter)
        except Exception as exc:  # noqa: BLE001 - sorted below: the document's fault, or the session's end
            text_fault = isinstance(exc, InputError) and "instruct" not in str(exc)
            error = state.error(exc, param="text" if text_fault else None)
            if error.status != 400 or error.param not in ("text", "lexicon"):
                raise SessionClosed(close_code(error, exc), error) from exc
            refused.append(error)
            async with sending:
                await send_error(ws, error, fatal=False)
            return seconds
        synthesis.documents += 1
        if synthesis.timer is not None:  # its words, where they are in the text as sent; no tag is a word
            synthesis.timer.feed_text(without_markup(text))
        deadlines.text_arrived()
        times.setdefault("first_text", time.perf_counter())
        await begin(seconds + more)
        synthesis.handle.add(items)
        return seconds + more

    async def receive() -> None:
        chars, seconds = 0, 0.0  # the text so far: length and estimated audio (the estimate adds up piece by piece)
        done = False
        received: list[str] = []  # kept only to decide when the text first has something to speak
        while True:
            try:
                data = await receive_json(ws, deadlines.timeout(idle=not done))
            except TimeoutError:
                raise deadlines.expired() from None
            kind = data["type"]
            if done:
                raise bad_message(f"no messages are expected after input.done (got {kind!r})")
            extra = sorted(set(data) - MESSAGE_KEYS.get(kind, set(data)))
            if extra:  # as session.config's: a misspelt "lexicon" or "input_format" must not be silently ignored
                raise bad_message(f"{kind} takes no field {extra[0][:40]!r} (its fields: "
                                  f"{', '.join(sorted(MESSAGE_KEYS[kind]))})", extra[0][:40])
            if kind == "input.text":
                text = data.get("text")
                if not isinstance(text, str):
                    raise bad_message("input.text needs a string 'text'", "text")
                try:
                    check_chars(text, "text")
                except TextError as exc:
                    raise bad_message(str(exc), "text") from exc
                chars += len(text)
                if chars > cfg.max_input_chars:
                    raise bad_message(f"the text is longer than {cfg.max_input_chars} characters", "text")
                fmt = data.get("input_format", synthesis.input_format)
                if fmt not in (None, "text", "ssml"):
                    raise bad_message(f"input_format must be 'text' or 'ssml', not {str(fmt)[:40]!r}", "input_format")
                if synthesis.ssml is None and text.strip():
                    synthesis.ssml = fmt == "ssml" or (fmt is None and looks_like_ssml(text))
                if synthesis.ssml and text.strip():
                    if fmt == "text":
                        raise bad_message("this session speaks SSML documents (its first text was one): every input.text "
                                   "is one whole <speak> document; open another session for plain text",
                                   "input_format")
                    seconds = await document(text, data.get("lexicon"), seconds)
                    continue
                if data.get("input_format") == "ssml" and synthesis.ssml is False:
                    raise bad_message("this session streams plain text (its first text was not SSML): send SSML documents "
                               "in a session of their own, with input_format 'ssml' in session.config",
                               "input_format")
                if data.get("lexicon") is not None and not synthesis.ssml:
                    raise bad_message("a lexicon on input.text applies to that SSML document alone; for streamed text give "
                               "it in session.config (a word may arrive in several pieces)", "lexicon")
                if synthesis.handle is None:
                    received.append(text)
                if synthesis.timer is not None:
                    synthesis.timer.feed_text(text)
                if not text.strip():
                    # Neither starts work nor moves the deadline, but in streamed text it is the boundary between
                    # the words on either side ("Hello", " ", "there"; dropping it said "Hellothere"): passed on like
                    # any piece (the text stream decides what a lone space is; before the engine starts it waits in
                    # ``pending``). Before the first text, or in an SSML session, it means nothing.
                    if synthesis.ssml is False:
                        await feed(text)
                    continue
                deadlines.text_arrived()
                times.setdefault("first_text", time.perf_counter())
                seconds += estimate_speech_seconds(text) / synthesis.speed
                if synthesis.handle is None and not tts.speakable("".join(received)):
                    pending.append(text)
                    continue
                if synthesis.handle is None:
                    pending.append(text)
                    await begin(seconds)
                else:
                    await begin(seconds)
                    await feed(text)
            elif kind == "input.done":
                # Nothing speakable at all is the client's error (and the engine's bi-streaming LM would wait
                # forever for a first text token).
                if synthesis.handle is None and (synthesis.ssml or not tts.speakable("".join(received))):
                    why = (f"every SSML document was refused (the last: {refused[-1].message})" if refused
                           else "the text is empty, or only punctuation or symbols")
                    raise bad_message(f"nothing to speak before input.done: {why}", "text")
                times.setdefault("first_text", time.perf_counter())
                if synthesis.handle is None:
                    await begin(seconds)
                try:
                    await anyio.to_thread.run_sync(synthesis.handle.end, limiter=state.limiter)
                except InputError as exc:
                    raise input_error_close(exc) from exc
                done = True
            else:
                raise bad_message(f"unknown message type {kind!r} (expected input.text or input.done)", "type")

    async def send_words(words) -> None:
        for word in words:
            async with sending:
                await deliver(ws.send_json({"type": "word", **word.to_dict()}))

    async def send() -> None:
        await synthesis.started.wait()
        stream, timer = synthesis.stream, synthesis.timer
        while (chunk := await stream.next()) is not None:
            if "first_chunk" not in times:
                times["first_chunk"] = time.perf_counter()
            async with sending:
                await deliver(ws.send_bytes(pcm16(chunk)))
            if timer is not None:
                await send_words(await anyio.to_thread.run_sync(timer.push, chunk, limiter=state.limiter))
        if timer is not None:
            await send_words(await anyio.to_thread.run_sync(timer.finish, limiter=state.limiter))

    async def guarded(fn, tg) -> None:
        try:
            await fn()
        except BaseException as exc:  # noqa: BLE001 - the first outcome decides; the other task is cancelled
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                outcome.append(exc)
        else:
            if fn is send:
                outcome.append(StopAsyncIteration())
        finally:
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(guarded, receive, tg)
        tg.start_soon(guarded, send, tg)
    result = outcome[0] if outcome else StopAsyncIteration()
    if not isinstance(result, StopAsyncIteration):
        raise result
    stream = synthesis.stream
    audio_s = stream.samples / synthesis.served.sample_rate
    start = times.get("first_text", stream.started)
    first = times["first_chunk"] - start if "first_chunk" in times else None
    if first is not None:
        state.metrics.observe_first_chunk(WS_PATH, first)
    state.metrics.observe_synthesis(WS_PATH, time.perf_counter() - start, audio_s)
    done = {"type": "audio.done", "audio_seconds": round(audio_s, 3),
            "first_chunk_seconds": None if first is None else round(first, 3)}
    await deliver(ws.send_json({**done, "truncated": True} if stream.truncated else done))
