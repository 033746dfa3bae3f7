"""Fixtures shared by the training tests."""

import pytest

from helpers import one_torch_thread
from hift_training_data import write_hift_corpus


@pytest.fixture(scope="session")
def hift_corpus(tmp_path_factory):
    """The six-utterance vocoder corpus of ``hift_training_data`` (read-only: tests write elsewhere)."""
    with one_torch_thread():
        return write_hift_corpus(tmp_path_factory.mktemp("hift_data"))
