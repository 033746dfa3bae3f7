"""The Python API's hostile-input sweep shares the built-in model and the hostile audio files with the CLI's
(tests/hostile_entry_points.py); the other API test modules bring their own ``tts``."""

from hostile_entry_points import audio, tts  # noqa: F401 (fixtures)
