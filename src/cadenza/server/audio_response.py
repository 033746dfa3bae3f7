"""The audio answer of a synthesis endpoint, streamed or whole (``/v1/audio/speech``, ``/v1/audio/voice-conversion``).

``StreamingAudio(audio_body(...), Finish(...))`` sends chunks as the engine makes them and frees the request exactly
once however the response ends; ``whole_response`` collects the utterance first and answers it with exact sizes.
"""

from __future__ import annotations

import logging
import time

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from cadenza.server.encoding import MEDIA_TYPES, make_encoder
from cadenza.server.engine_stream import EngineStream
from cadenza.server.state import ServerState

# Set on an answer cut at the server's max_audio_seconds (docs/server.md, "Limits").
TRUNCATED_HEADER = "X-Audio-Truncated"

log = logging.getLogger(__name__)


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the request body has already been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first_step(state: ServerState, stream: EngineStream, step, endpoint: str, started: float):
    """``stream.map(step)`` for the first chunk, before any header is sent, so that an error before the audio still
    gets its proper status; its latency goes to the metrics."""
    try:
        first = await stream.map(step)
    except Exception as exc:
        raise state.error(exc) from exc
    state.metrics.observe_first_chunk(endpoint, time.perf_counter() - started)
    return first


class Finish:
    """Frees a streamed request exactly once: from the body generator's ``finally``, or -- when the client left
    before the generator even started, so its ``finally`` never runs -- from the response's."""

    def __init__(self, state: ServerState, stream: EngineStream, slot, started: float, sample_rate: int,
                 endpoint: str) -> None:
        self.state, self.stream, self.slot, self.started = state, stream, slot, started
        self.endpoint = endpoint
        self.sample_rate = sample_rate
        self.done = False

    def __call__(self, completed: bool) -> None:
        if self.done:
            return
        self.done = True
        self.stream.cancel()  # no-op when it finished; frees the engine request when the client left
        self.slot.release()
        metrics = self.state.metrics
        if completed:
            audio_s = self.stream.samples / self.sample_rate
            metrics.observe_synthesis(self.endpoint, time.perf_counter() - self.started, audio_s)
        else:
            metrics.count_disconnect()


class StreamingAudio(StreamingResponse):
    def __init__(self, content, finish: Finish, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._finish = finish

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._finish(False)


async def audio_body(stream: EngineStream, step, first, finish: Finish):
    completed = False
    try:
        data, done = first
        if data:
            yield data
        while not done:
            data, done = await stream.map(step)
            if data:
                yield data
        completed = True
    except Exception:
        completed = True  # a failure, not a disconnect: the connection is dropped, the client sees it truncated
        log.exception("speech stream failed after the response started")
        raise
    finally:
        finish(completed)


async def whole_response(state: ServerState, stream: EngineStream, request: Request, response_format: str,
                         headers: dict, started: float, sample_rate: int, endpoint: str) -> Response:
    """Non-streamed answer: the whole utterance, encoded with exact sizes. A client that leaves cancels it."""
    chunks: list[np.ndarray] = []
    disconnected = False

    async def collect() -> None:
        while (chunk := await stream.next()) is not None:
            if not chunks:
                state.metrics.observe_first_chunk(endpoint, time.perf_counter() - started)
            chunks.append(chunk)
        tg.cancel_scope.cancel()

    async def watch() -> None:
        nonlocal disconnected
        await wait_for_disconnect(request)
        disconnected = True
        tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            tg.start_soon(watch)
    except Exception as exc:
        raise state.error(getattr(exc, "exceptions", [exc])[0]) from exc
    if disconnected:
        stream.cancel()
        state.metrics.count_disconnect()
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    state.metrics.observe_synthesis(endpoint, time.perf_counter() - started, audio.size / sample_rate)

    def encode() -> bytes:
        enc = make_encoder(response_format, sample_rate, total_samples=audio.size)
        return enc.encode(audio) + enc.finish()

    data = await anyio.to_thread.run_sync(encode, limiter=state.limiter)
    if stream.truncated:  # cut at max_audio_seconds: the estimate let it through, the model ran on
        headers = {**headers, TRUNCATED_HEADER: "true"}
    return Response(data, media_type=MEDIA_TYPES[response_format], headers=headers)
