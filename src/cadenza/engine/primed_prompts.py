"""Primed flow prompts: the incremental flow's state of a voice's prompt, computed once and copied per request.

The first chunk of every streaming request also computes its prompt's frames (encoder, and the estimator's 10
Euler steps x 2 CFG rows): on the built-in model that is most of the first chunk's flow time. The prompt's complete
chunks depend on nothing but the prompt, so a request of a voice seen before starts from a copy of that voice's
primed ``IncrementalFlow`` (``prime`` / ``clone``; the same mel, tested) instead.

Entries are keyed by a digest of the prompt's content (its flow prompt tokens, mel and speaker embedding): a saved
speaker, a stored voice or the same prompt file uploaded again all hit, whatever object carries them. The least
recently used go first once the cached state passes ``limit_bytes``. Safe to use from several threads at once.
"""

from __future__ import annotations

import collections
import hashlib
import threading

import torch

from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt


def prompt_digest(prompt: SpeakerPrompt) -> bytes:
    """A digest of everything the flow takes from ``prompt`` (tokens, mel, embedding: values, shapes and dtypes)."""
    h = hashlib.blake2b(digest_size=16)
    for t in (prompt.flow_prompt_speech, prompt.prompt_mel, prompt.embedding):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.digest()


class PrimedPrompts:
    def __init__(self, flow: TokenToMelFlow, limit_bytes: int) -> None:
        self._flow = flow
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[bytes, IncrementalFlow] = collections.OrderedDict()  # oldest use first
        self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(session.nbytes for session in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def session(self, prompt: SpeakerPrompt) -> IncrementalFlow:
        """A new request's flow session for ``prompt``: a copy of its primed state (computed now on first use)."""
        return self.cached(prompt) or self.prime(prompt)

    def cached(self, prompt: SpeakerPrompt) -> IncrementalFlow | None:
        """A copy of ``prompt``'s primed state if it is kept, else None (counted as a miss: ``prime`` it)."""
        key = prompt_digest(prompt)
        with self._lock:
            primed = self._entries.get(key)
            if primed is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return primed.clone()
            self.misses += 1
        return None

    def prime(self, prompt: SpeakerPrompt) -> IncrementalFlow:
        """Compute ``prompt``'s primed state, keep it (within the byte limit) and return a copy for one request."""
        key = prompt_digest(prompt)
        primed = IncrementalFlow(self._flow, prompt.flow_prompt_speech, prompt.prompt_mel, prompt.embedding)
        primed.prime()  # outside the lock: another thread may prime another voice meanwhile
        if self.limit_bytes <= 0 or primed.nbytes > self.limit_bytes:
            return primed  # too big to keep: this request uses it, nobody else
        session = primed.clone()
        with self._lock:
            old = self._entries.pop(key, None)  # primed twice at once: keep the newer
            self._entries[key] = primed
            dropped = self._evict()
        for stale in ([old] if old is not None else []) + dropped:
            stale.close()
        return session

    def _evict(self) -> list[IncrementalFlow]:
        """Take the least recently used entries beyond the byte limit out (the caller closes them). Caller holds the
        lock."""
        total, dropped = sum(session.nbytes for session in self._entries.values()), []
        while total > self.limit_bytes and self._entries:
            _, session = self._entries.popitem(last=False)
            total -= session.nbytes
            dropped.append(session)
        return dropped

    def forget(self, prompt: SpeakerPrompt) -> bool:
        """Drop ``prompt``'s primed state (its voice was deleted); whether there was one."""
        with self._lock:
            session = self._entries.pop(prompt_digest(prompt), None)
        if session is not None:
            session.close()
        return session is not None

    def __contains__(self, prompt: SpeakerPrompt) -> bool:
        with self._lock:
            return prompt_digest(prompt) in self._entries

    def clear(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), collections.OrderedDict()
        for session in entries:
            session.close()
