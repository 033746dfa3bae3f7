"""The server's warm-up: one short phrase per model before it listens, skipped for a model that needs a voice."""

from __future__ import annotations

import logging

from cadenza.api.cosyvoice2 import Cadenza
from cadenza.api.warm_up import warm_up


def test_a_model_with_a_default_voice_is_warmed_up(builtin_tts):
    seconds = warm_up(builtin_tts)
    assert seconds is not None and seconds > 0


def test_a_model_that_cannot_speak_the_phrase_stays_cold_and_says_why(cv2_dir, caplog):
    """The fixture's release-format folder has no text tokenizer (token ids only) and no default voice."""
    with Cadenza.from_pretrained(cv2_dir) as model, caplog.at_level(logging.INFO, logger="cadenza.api.warm_up"):
        assert warm_up(model, "release") is None
    assert "release: not warmed up: " in caplog.text and "text tokenizer" in caplog.text
