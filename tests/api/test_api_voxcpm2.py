"""``cadenza.api.VoxCPM2`` on the fixture's tiny model: the arguments it takes and refuses, and the serving half of
the ``SpeechModel`` protocol both families implement."""

from __future__ import annotations

import numpy as np
import pytest

import cadenza
from cadenza.api.protocol import SpeechModel
from cadenza.errors import InputError, TextError


@pytest.fixture(scope="module")
def vx2(vx2_model_dir):
    with cadenza.load(vx2_model_dir) as model:
        yield model


def test_both_families_implement_the_protocol(vx2, cv2_dir):
    assert isinstance(vx2, SpeechModel)
    with cadenza.load(cv2_dir) as cv2:
        assert isinstance(cv2, SpeechModel)
        assert cv2.capabilities.family == "cosyvoice2" and cv2.capabilities.text_streaming == "tokens"
    caps = vx2.capabilities
    assert (caps.family, caps.sample_rate, caps.speed, caps.output_frame_samples) == ("voxcpm2", 48000, (0.5, 2.0), 7680)


def test_arguments_of_the_other_family_are_named(vx2):
    for name, value, hint in (("instruct", "cheerful", "(description)text"),
                              ("text_ids", [1, 2], "text itself")):
        with pytest.raises(InputError, match=f"do not take {name}") as info:
            vx2.synthesize("Hello there.", **{name: value})
        assert hint in str(info.value)
    with pytest.raises(InputError, match="'temprature'"):
        vx2.synthesize("Hello there.", temprature=0.5)
    same = vx2.synthesize("Hello there.", seed=2, speed=1.0).samples  # speed 1.0 asks for nothing
    np.testing.assert_array_equal(same, vx2.synthesize("Hello there.", seed=2).samples)


def test_segments_keep_the_description_on_every_segment(vx2):
    text = "(A calm voice)" + " ".join(f"This is sentence number {k}." for k in range(200))
    segments = vx2.segments(text)
    assert len(segments) > 1 and all(s.startswith("(A calm voice)") for s in segments)
    assert "sentence number twelve" in " ".join(segments)  # normalised
    with pytest.raises(TextError, match="nothing to speak"):
        vx2.segments("(A calm voice)...")


def test_plan_makes_one_request_per_segment_and_refuses_two_descriptions(vx2):
    plan = vx2.plan(["Hello there.", "How are you?"], None, instructions="A bright voice", seed=5)
    assert [r.seed for r in plan.requests] == [5, 6]
    assert all(r.text.description == "A bright voice" for r in plan.requests)
    assert plan.text_tokens == sum(r.target_len for r in plan.requests)
    with pytest.raises(InputError, match="not both"):
        vx2.plan(["(calm)Hello there."], None, instructions="A bright voice")
    assert {r.speed for r in vx2.plan(["Hello."], None, speed=0.8).requests} == {0.8}
    with pytest.raises(InputError, match="speed must be between 0.5 and 2.0, got 2.5"):
        vx2.plan(["Hello."], None, speed=2.5)


def test_saved_voices_of_a_store_are_speakers(vx2_model_dir, tmp_path):
    from cadenza.errors import UnknownSpeakerError, VoiceFamilyError
    from cadenza.voices import VoiceStore

    from test_server_harness import CONSENT, speech_prompt

    samples, sr = speech_prompt(2.0)
    with VoiceStore(tmp_path / "voices") as store:
        store.add("cora", (samples, sr), "Hello.", CONSENT)  # a CosyVoice 2 voice
    with cadenza.load(vx2_model_dir, voices_dir=tmp_path / "voices") as tts:
        record = tts.voice_prompts.create("vera", (samples, sr), None, CONSENT)
        assert (record.family, record.cloning) == ("voxcpm2", "reference")
        by_name = tts.synthesize("Hello there.", speaker="vera", seed=4).samples
        by_audio = tts.synthesize("Hello there.", voice=tts.voice_prompts.resolve("vera").prompt, seed=4).samples
        np.testing.assert_array_equal(by_name, by_audio)
        uses = tts.voices.consent_record("vera")["uses"]
        in_pieces = list(tts.synthesize_stream(iter(["Hello ", "there."]), speaker="vera", seed=4))
        assert len(np.concatenate(in_pieces)) == len(by_name)
        assert tts.voices.consent_record("vera")["uses"] == uses + 1  # one use, however it is spoken
        with pytest.raises(VoiceFamilyError, match="CosyVoice 2"):
            tts.synthesize("Hello there.", speaker="cora")
        with pytest.raises(InputError, match="not both"):
            tts.synthesize("Hello there.", speaker="vera", reference_wav=(samples, sr))
    with cadenza.load(vx2_model_dir) as tts, pytest.raises(UnknownSpeakerError, match="voices_dir"):
        tts.synthesize("Hello there.", speaker="vera")


def test_oversized_prompt_transcripts_and_descriptions_are_text_errors(vx2):
    """Bounded as CosyVoice 2's (the voice store's 2,000 characters; the server's 4,096 for a description)."""
    with pytest.raises(TextError, match="prompt_text is 2001 characters; at most 2000"):
        vx2.synthesize("Hello there.", prompt_wav=(np.zeros(16000, np.float32), 16000), prompt_text="a" * 2001)
    with pytest.raises(TextError, match="description is 4097 characters; at most 4096"):
        vx2.design("a" * 4097, "Hello there.")


def _pieces(text: str):
    for word in text.split():
        yield word + " "


def test_text_in_pieces_is_spoken_a_sentence_at_a_time(vx2_model_dir):
    """``synthesize_stream(iterator)`` (an LLM's tokens): each sentence once it is complete, sentence i with seed +
    1000 i, as the server's WebSocket speaks them; voice and timestamps as for a whole text. (Unmarked: the watermark
    runs on across the sentences of one stream, so a marked stream differs from sentences marked one by one.)"""
    from test_server_harness import speech_prompt

    text = "Hello there, this is text. It keeps coming for a while."
    with cadenza.load(vx2_model_dir, watermark=False) as vx2:
        _check_pieces(vx2, text, speech_prompt(2.0))


def _check_pieces(vx2, text: str, reference) -> None:
    chunks = list(vx2.synthesize_stream(_pieces(text), seed=3))
    first = vx2.synthesize("Hello there, this is text.", seed=3).samples
    second = vx2.synthesize("It keeps coming for a while.", seed=1003).samples
    np.testing.assert_allclose(np.concatenate(chunks), np.concatenate([first, second]), atol=1e-5)
    timed = list(vx2.synthesize_stream(_pieces(text), seed=3, timestamps=True))
    assert [w.word for chunk in timed for w in chunk.words] == text.split()
    cloned = np.concatenate(list(vx2.synthesize_stream(_pieces("Hello there."), seed=5, reference_wav=reference)))
    np.testing.assert_allclose(cloned, vx2.synthesize("Hello there.", seed=5, reference_wav=reference).samples,
                               atol=1e-5)
    designed = np.concatenate(list(vx2.synthesize_stream(_pieces("Hello there."), seed=5, instructions="A calm man")))
    np.testing.assert_allclose(designed, vx2.synthesize("(A calm man)Hello there.", seed=5).samples, atol=1e-5)


def test_a_seed_near_the_top_speaks_every_sentence_of_pieces(vx2):
    """Sentence k of text pieces uses seed + 1000 k: near 2**63 the second sentence's seed was refused half-way
    through the stream; it wraps into [0, 2**63) now."""
    chunks = list(vx2.synthesize_stream(iter(["Hello there. ", "Good bye now."]), seed=2**63 - 1000))
    assert sum(c.size for c in chunks) > 0


def test_bad_text_pieces_get_specific_errors(vx2):
    with pytest.raises(InputError, match="cfg_value cannot be set for text that arrives in pieces"):
        list(vx2.synthesize_stream(_pieces("Hello there."), cfg_value=3.0))
    with pytest.raises(TextError, match="nothing to speak"):
        list(vx2.synthesize_stream(iter(["", " ", "..."])))
    with pytest.raises(TextError, match=r"not int \(piece 1\)"):
        list(vx2.synthesize_stream(iter(["Hello ", 5])))
    with pytest.raises(TextError, match="string or an iterable of strings, not bytes"):
        vx2.synthesize_stream(b"Hello")
    with pytest.raises(InputError, match="SSML is read as one whole document"):
        vx2.synthesize_stream(_pieces("Hello."), input_format="ssml")


def test_a_book_streams_planned_a_block_at_a_time_with_its_description_and_seeds(vx2, vx2_model_dir, monkeypatch):
    """Past ``LAZY_PLAN_CHARS`` VoxCPM 2 plans a block at a time as it speaks (``api/request_batches.py``): the first
    audio comes with the first block planned only; every request keeps the text's leading ``(description)`` and the
    seeds run on across blocks; the voice is resolved once."""
    from cadenza.api import markup
    from cadenza.api import request_batches as planning

    text = "(A calm voice)" + " ".join(f"This is sentence number {k % 50}." for k in range(3000))
    assert len(text) > planning.LAZY_PLAN_CHARS
    blocks, built = [], []
    real_blocks, real_batches = planning.text_blocks, markup.voxcpm2_request_batches

    def counting_blocks(text, block_chars):
        for block in real_blocks(text, block_chars):
            blocks.append(len(block))
            yield block

    def recording_batches(*args, **kwargs):
        for batch in real_batches(*args, **kwargs):
            built.append(batch)
            yield batch

    monkeypatch.setattr(planning, "text_blocks", counting_blocks)
    monkeypatch.setattr(markup, "voxcpm2_request_batches", recording_batches)
    stream = vx2.synthesize_stream(text, seed=7)
    assert next(stream).size > 0
    assert len(blocks) == 1 and len(built) == 1  # nothing beyond the first block before the first audio
    stream.close()
    requests = [r for batch in real_batches(vx2, iter(
        [[markup.Run(vx2.segments("(A calm voice)" + b, max_tokens=vx2._whole_tokens), 1.0)]
         for b in list(real_blocks(text.removeprefix("(A calm voice)"), planning.VOXCPM2_BLOCK_CHARS))[:2]]), seed=7)
        for r in batch]
    assert all(r.text.description == "A calm voice" for r in requests)
    assert [r.seed for r in requests] == list(range(7, 7 + len(requests))) and len(requests) > 2
    assert [r.seed for r in built[0]] == [r.seed for r in requests[: len(built[0])]]

    # a reference voice is encoded once for the whole book, not once per block
    calls = []
    real_voice = vx2.engine.voice
    monkeypatch.setattr(vx2.engine, "voice", lambda **kw: calls.append(kw) or real_voice(**kw))
    batches = real_batches(vx2, iter([[markup.Run(["Hello there."], 1.0)], [markup.Run(["Goodbye."], 1.0)]]),
                           seed=1, reference_wav=vx2_model_dir.parent / "wavs" / "ref_16k.wav")
    assert [len(b) for b in batches] == [1, 1] and len(calls) == 1
