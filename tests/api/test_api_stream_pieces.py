"""What bi-streamed text pieces (``synthesize_stream`` over an iterator: an LLM's tokens) become before the LM reads
them: respelled by a lexicon, without Markdown — the audio is exactly that of the pieces so changed; SSML in pieces
is refused."""

from __future__ import annotations

import numpy as np
import pytest

from cadenza import Cadenza, CadenzaError
from cadenza.errors import InputError

from test_server_harness import speech_prompt
from toy_model import build_toy_model_dir

TRANSCRIPT = "Just by listening a few minutes a day."
LEXICON = [{"word": "Cadenza", "respelling": "ka den za"}, {"word": "SQL", "respelling": "sequel",
                                                             "case_sensitive": True}]


@pytest.fixture(scope="module")
def tts(cv2_dir, tmp_path_factory) -> Cadenza:
    with Cadenza.from_pretrained(build_toy_model_dir(cv2_dir, tmp_path_factory.mktemp("toy") / "model")) as model:
        yield model


def _stream(tts, pieces: list[str], seed: int, **kwargs) -> np.ndarray:
    return np.concatenate(list(tts.synthesize_stream(iter(pieces), prompt_wav=speech_prompt(), prompt_text=TRANSCRIPT,
                                                     seed=seed, **kwargs)))


def _plain(tts, pieces: list[str]) -> tuple[np.ndarray, int]:
    """The audio of ``pieces`` and its seed: the random-weight LM may emit a special token mid-text for a seed (an
    error), so the first seed that speaks them is taken."""
    for seed in range(1, 12):
        try:
            return _stream(tts, pieces, seed), seed
        except CadenzaError:
            continue
    raise AssertionError("no seed speaks the pieces")


def test_a_lexicon_respells_bi_streamed_pieces(tts):
    plain, seed = _plain(tts, ["ka den za ", "speaks ", "sequel."])
    np.testing.assert_array_equal(_stream(tts, ["Cadenza ", "speaks ", "SQL."], seed, lexicon=LEXICON), plain)
    with pytest.raises(InputError, match="SSML is read as one whole document"):
        _stream(tts, ["<speak>Hi ", "there.</speak>"], 1, input_format="ssml")


def test_markdown_in_bi_streamed_pieces_is_not_read(tts):
    assert tts.capabilities.text_streaming == "tokens"
    plain, seed = _plain(tts, ["Cadenza ", "speaks ", "fast."])
    # The same pieces once the markup is gone (BPE reads each piece as it comes, so where pieces end matters).
    np.testing.assert_array_equal(_stream(tts, ["**Cadenza** ", "speaks ", "`fast.`"], seed), plain)
    np.testing.assert_array_equal(_stream(tts, ["# Cadenza ", "speaks ", "_fast_."], seed), plain)
