"""The CLI tests share one built-in model per module, the hostile audio files and the in-process
CLI (tests/hostile_entry_points.py)."""

from hostile_entry_points import audio, cli, tts  # noqa: F401 (fixtures)
