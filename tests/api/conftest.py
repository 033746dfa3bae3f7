"""Fixtures of the Python API's hostile-input sweep (tests/hostile_entry_points.py); the other API test modules
bring their own ``tts``."""

from __future__ import annotations

import pytest

from hostile_entry_points import builtin_model, hostile_audio_files


@pytest.fixture(scope="module")
def tts():
    yield from builtin_model()


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    return hostile_audio_files(tmp_path_factory.mktemp("audio"))
