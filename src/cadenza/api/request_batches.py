"""A text's engine requests, planned a block at a time (``request_batches``), and a long text streamed as it is
planned (``stream_long_text``; VoxCPM 2: ``stream_long_text_voxcpm2``): a book's first audio waits for its first
block only (``text/blocks.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from cadenza.api import markup
from cadenza.api.arguments import (
    SYNTHESIS_ARGUMENTS,
    check_flag,
    check_speed,
    reference_as_prompt,
    refuse_unknown,
    seed_at,
)
from cadenza.engine.long_form import stream_planned
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.silence import marked_chunks, with_silences
from cadenza.errors import TextError
from cadenza.models.cosyvoice2.frontend import check_speakable, is_speakable
from cadenza.models.voxcpm2.request_text import is_speakable as speakable
from cadenza.models.voxcpm2.request_text import split_description
from cadenza.text import normalize as normalize_text
from cadenza.text.blocks import text_blocks
from cadenza.text.phonemes import other_script_at

# A longer text is streamed as it is planned, a block at a time (its first audio waits for its first block only).
LAZY_PLAN_CHARS, PLAN_BLOCK_CHARS = 20_000, 8_000
# VoxCPM 2 reads segments of up to ~2,000 tokens (as few as fit: an unpinned voice may drift between them), so its
# blocks are larger: ~4 such segments each.
VOXCPM2_BLOCK_CHARS = 32_000


def request_batches(tts, text: str | None = None, *, block_chars: int | None = None, text_ids=None,
                    normalize: bool = True, prompt_wav=None, prompt_text=None, prompt_text_ids=None, instruct=None,
                    speaker=None, seed: int | None = None, speed: float = 1.0,
                    reference_wav=None, **unknown) -> Iterator[list[SynthesisRequest]]:
    """``requests`` a block of the text at a time (``block_chars``: ``text_blocks``; None: the whole text in one
    batch): arguments and voice are checked with the first batch; a later block with nothing to speak gives []."""
    refuse_unknown(unknown, "synthesis", SYNTHESIS_ARGUMENTS)
    check_flag(normalize, "normalize")
    prompt_wav = reference_as_prompt(reference_wav, prompt_wav, prompt_text, prompt_text_ids)
    tts._check_args(text, text_ids, prompt_text, seed, speed)
    if normalize and prompt_text is not None and prompt_text.strip():
        prompt_text = normalize_text(prompt_text)
    voice, mode, lm_text, lm_speech = tts._voice(prompt_wav, prompt_text, prompt_text_ids, instruct, speaker)
    eng, k = tts.engine, 0
    if text is None:
        batches: Iterable[list] = [[eng.check_text_ids(text_ids)]]
    elif block_chars is None:
        batches = [[eng.frontend.text_ids(s) for s in tts.segments(text, normalize)]]
    else:  # a block of only marks or rules speaks nothing
        blocks = list(text_blocks(check_speakable(text), block_chars))  # cuts only: ~1 ms a million characters
        check_scripts(tts, blocks, normalize)
        batches = ([eng.frontend.text_ids(s) for s in tts.segments(block, normalize)] if is_speakable(block) else []
                   for block in blocks)
    for ids in batches:
        yield [eng.build(text_ids=t, voice=voice, mode=mode, lm_prompt_text=lm_text, lm_prompt_speech=lm_speech,
                         seed=seed_at(seed, k + j), speed=speed) for j, t in enumerate(ids)]
        k += len(ids)


def check_scripts(tts, blocks: list[str], normalize: bool) -> None:
    """Refuse now, before any audio, a block with a letter the model cannot read (another script, for a phoneme
    model), which would otherwise end a book's stream where that block's audio was to begin, minutes into it. Only a
    block with such a letter in its raw text is planned here (a few milliseconds a million characters otherwise)."""
    check = getattr(tts.engine.frontend.tokenizer, "check_script", None)
    if check is None:
        return
    for block in blocks:
        if other_script_at(block) is not None and is_speakable(block):
            for segment in tts.segments(block, normalize):  # as it will be read: normalised, then the lexicon
                check(segment)


def stream_long_text(tts, text: str, **kwargs) -> Iterator[np.ndarray]:
    """``tts.synthesize_stream(text)`` for a text of any length, planned as it is spoken (``stream_planned``): the
    arguments, the voice, the first block and every block's script are checked now, before any audio; a later
    block's other error is raised where its audio would have begun. A text planned whole gives the same segments (one sentence per segment, the built-in
    model) or the same but for segments that would have spanned a block's end (``text/blocks.py``)."""
    batches = request_batches(tts, text, block_chars=PLAN_BLOCK_CHARS, **kwargs)
    first = next(batches)
    while not first:  # a first block with nothing to speak (a text opening with 8,000 characters of rules)
        first = next(batches, None)
        if first is None:
            raise TextError("text has nothing to speak after normalisation")
    return stream_planned(tts.engine.scheduler.submit, first, batches)


def stream_long_text_voxcpm2(tts, text: str, kwargs: dict) -> Iterator[np.ndarray]:
    """``VoxCPM2.synthesize_stream(text)`` for a text of any length, planned a block at a time as it is spoken: each
    block cut into the model's long segments (``_whole_tokens``) with the text's leading ``(description)`` on every
    one, seeds running on across blocks, the voice resolved once; marked as ``markup.synthesize_stream`` marks."""
    description, spoken = split_description(text)
    head = f"({description})" if description is not None else ""
    normalize = kwargs.get("normalize", True)
    speed = check_speed(kwargs.pop("speed", 1.0))
    scripts = ([markup.Run(tts.segments(head + block, normalize, max_tokens=tts._whole_tokens), speed)]
               for block in text_blocks(spoken, VOXCPM2_BLOCK_CHARS) if speakable(block))
    batches = markup.voxcpm2_request_batches(tts, scripts, **kwargs)
    first = next(batches, None)
    if first is None:
        raise TextError("text has nothing to speak after normalisation: it needs at least one letter or digit")
    return marked_chunks(stream_planned(with_silences(tts.submit), first, batches), tts.mark.embedder())
