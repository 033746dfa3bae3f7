"""Text that arrives in pieces, spoken by a CosyVoice 2 model: bi-streamed, or a sentence at a time.

One bi-streaming request whose LM reads the pieces as they come (audio starts a few words in), or, for an LM that
reads one sentence at a time (``CosyVoice2Frontend.one_sentence_per_segment``: cadenza-tiny), each sentence a request
of its own once it is complete (audio starts after the first sentence). Across sentence ends the built-in LM
bi-streamed kept 64 % of the words of 12 three-sentence texts, a sentence at a time 95 % (docs/text.md).
"""

from __future__ import annotations

from collections.abc import Callable

from cadenza.api.arguments import seed_at
from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.text_stream import SentenceTextStream, TokenTextStream
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt


def cosyvoice2_text_stream(engine: CosyVoice2Engine, segments: Callable[[str], list[str]], voice: SpeakerPrompt | None,
                     mode: str, lm_text, lm_speech, seed: int | None,
                     speed: float) -> TokenTextStream | SentenceTextStream:
    """A text stream (``feed``/``end``/``fail``, iterate for audio) for one voice; ``segments(text)`` cuts a
    complete sentence into the model's segments. Sentence ``i``'s segment ``k`` uses ``seed + 1000 i + k``."""
    if not engine.frontend.one_sentence_per_segment:
        request = engine.build_bistream(voice=voice, mode=mode, lm_prompt_text=lm_text, lm_prompt_speech=lm_speech,
                                        seed=seed, speed=speed)
        return TokenTextStream(engine.stream_bistream(request), engine.frontend.text_stream_encoder())

    def make(text: str, index: int) -> list[SynthesisRequest]:
        if not engine.frontend.speakable(text):
            return []
        first = seed_at(seed, 1000 * index)
        return [engine.build(text_ids=engine.frontend.text_ids(segment), voice=voice, mode=mode,
                             lm_prompt_text=lm_text, lm_prompt_speech=lm_speech,
                             seed=seed_at(first, k), speed=speed)
                for k, segment in enumerate(segments(text))]

    return SentenceTextStream(engine.scheduler.submit, make)

