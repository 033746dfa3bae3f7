"""The flow's own mels of a corpus (``cadenza.training.hift.flow_mels``): what the vocoder fine-tune reads."""

from __future__ import annotations

import pytest
import torch

from cadenza.builtin import builtin_model_dir
from cadenza.data.extractors import Utterance, load_extractor
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.loader import inspect_directory, load_cosyvoice2_weights
from cadenza.training.hift.flow_mels import FlowMelExtractor
from helpers import one_torch_thread

BUILTIN = builtin_model_dir()


@pytest.fixture(scope="module")
def extractor():
    with one_torch_thread():
        return load_extractor(f"cadenza.training.hift.flow_mels:flow_mel_extractor={BUILTIN}")


def _utterance(samples: int, tokens: torch.Tensor) -> Utterance:
    wav = 0.01 * torch.randn(samples, generator=torch.Generator().manual_seed(0))
    return Utterance("u0", "hello", wav, 24000, stored={"speech_tokens": tokens.int()})


def test_flow_mel_is_the_flow_of_the_stored_tokens_in_the_default_voice_one_frame_per_hop(extractor):
    assert isinstance(extractor, FlowMelExtractor) and extractor.needs == ("speech_tokens",)
    tokens = torch.randint(0, 453, (30,), generator=torch.Generator().manual_seed(1))
    voice = extractor.voice  # the default speaker of cadenza.json (joe)
    with one_torch_thread(), torch.inference_mode():
        out = extractor(_utterance(30 * 960, tokens))["flow_mel"]
        # The flow loaded alone computes what the whole model's loader gives (the engine's flow, its saved voice).
        engine = load_cosyvoice2_weights(inspect_directory(BUILTIN)).flow
        expected = engine.inference(tokens[None].long(), voice.flow_prompt_speech, voice.prompt_mel,
                                    voice.embedding, streaming=False, finalize=True)[0].T
        assert out.shape == (60, 80) and out.dtype == torch.float32
        assert torch.allclose(out, expected, atol=1e-5)
        # Audio a little longer than its tokens (the last token's remainder): the last frame is repeated; shorter:
        # the extra frames are cut. Frames always match samples // hop of the stored waveform.
        longer = extractor(_utterance(30 * 960 + 500, tokens))["flow_mel"]
        assert longer.shape == (61, 80) and torch.equal(longer[60], longer[59])
        assert torch.allclose(longer[:60], expected, atol=1e-5)
        shorter = extractor(_utterance(29 * 960, tokens))["flow_mel"]
        assert shorter.shape == (58, 80) and torch.allclose(shorter, expected[:58], atol=1e-5)
    assert (out.std(dim=0) > 0.05).float().mean() > 0.5  # a real spectrogram, not a constant


def test_flow_mel_extractor_names_a_missing_voice():
    with pytest.raises(InputError, match="no saved voice 'nobody'.*joe"):
        FlowMelExtractor(BUILTIN, "nobody")
