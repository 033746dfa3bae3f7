"""Text that arrives in pieces (an upstream LLM's tokens), fed to a model's text stream off the consumer's thread.

Both families' ``synthesize_stream(pieces)`` come through here: CosyVoice 2 into its bi-streaming LM or a sentence at
a time (``cosyvoice2_text_stream``), VoxCPM 2 a sentence at a time (``SpeechModel.open_text_stream``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from cadenza.api.arguments import check_chars
from cadenza.engine.text_stream import SentenceTextStream, TokenTextStream
from cadenza.errors import TextError


def feed_in_background(pieces: Iterable[str], stream: TokenTextStream | SentenceTextStream,
                       speakable: Callable[[str], bool]) -> None:
    """Feed ``pieces`` into ``stream`` on a thread of its own (the upstream iterator may block: it is read off the
    consumer's thread); a piece that is not text, or a stream with nothing to speak (no piece ``speakable``), fails
    the stream."""
    def feed() -> None:
        try:
            any_speakable = False
            for n, piece in enumerate(pieces):
                if not isinstance(piece, str):
                    raise TextError(f"text pieces must be strings, not {type(piece).__name__} (piece {n})")
                check_chars(piece, f"text piece {n}")
                any_speakable = any_speakable or speakable(piece)
                stream.feed(piece)
            if not any_speakable:
                raise TextError("the text stream ended with nothing to speak (no pieces, or only whitespace "
                                "and punctuation)")
            stream.end()
        except BaseException as exc:  # noqa: BLE001 - delivered to the consumer
            stream.fail(exc)

    threading.Thread(target=feed, name="cadenza-text-feed", daemon=True).start()
