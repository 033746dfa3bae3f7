"""Fixtures of the CLI's hostile-input sweeps (tests/hostile_entry_points.py)."""

from __future__ import annotations

import pytest

from hostile_entry_points import builtin_model, cli_runner, hostile_audio_files


@pytest.fixture(scope="module")
def tts():
    yield from builtin_model()


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    return hostile_audio_files(tmp_path_factory.mktemp("audio"))


@pytest.fixture
def cli(tts, monkeypatch, capsys):
    return cli_runner(tts, monkeypatch, capsys)
