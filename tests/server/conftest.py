"""Models the server tests share: the toy CosyVoice 2 (``toy_model``) and the VoxCPM 2 fixture, one of each per
test module."""

from __future__ import annotations

import pytest

import cadenza
from cadenza import Cadenza

from toy_model import build_toy_model_dir


@pytest.fixture(scope="module")
def cv2(cv2_dir, tmp_path_factory) -> Cadenza:
    with Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")) as model:
        yield model


@pytest.fixture(scope="module")
def tts(cv2) -> Cadenza:
    """The toy CosyVoice 2 under the name most server tests give it."""
    return cv2


@pytest.fixture(scope="module")
def vx2(vx2_model_dir):
    with cadenza.load(vx2_model_dir) as model:
        yield model
