"""Warming a model up before its first real request (``cadenza serve`` does it for every model it serves).

A model's first request in a process pays for first calls: the engine's worker threads start, oneDNN sets up its
kernels, a voice's flow prompt is primed, on a GPU the LM's CUDA graphs are captured. Without a warm-up the first
user of a fresh server waits for all of it (the built-in model on a 2-core CPU: its first chunk ~0.4 s later than
the next requests'; docs/server.md). A long-running program (a server, a voice agent) calls ``warm_up`` once after
loading; ``cadenza serve`` does so with each model before it listens (``--no-warmup`` skips it).
"""

from __future__ import annotations

import logging
import time

from cadenza.errors import CadenzaError

log = logging.getLogger(__name__)

WARM_UP_TEXT = "Warm up, please."


def warm_up(model, name: str | None = None) -> float | None:
    """Stream ``WARM_UP_TEXT`` once with ``model``'s default voice (the audio is dropped). Returns the seconds it
    took, or None for a model that cannot speak it as it is (a released CosyVoice 2 folder without a default
    speaker needs a voice in every request; one without a text tokenizer takes token ids only): it stays cold, and
    the log says why. ``name``: how the log calls the model (default: its folder's name)."""
    name = name or model.directory.name
    start = time.perf_counter()
    try:
        for _ in model.synthesize_stream(WARM_UP_TEXT, seed=0):
            pass
    except CadenzaError as exc:  # what the model cannot do is a request's problem later, not the start's
        log.info("%s: not warmed up: %s", name, exc)
        return None
    return time.perf_counter() - start
