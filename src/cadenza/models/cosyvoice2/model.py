"""``CosyVoice2Model``: the three networks of a CosyVoice 2 checkpoint, with their config. No request state here."""

from __future__ import annotations

from torch import nn

from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.hift import HiFTGenerator
from cadenza.models.cosyvoice2.lm import TextSpeechLM


class CosyVoice2Model(nn.Module):
    """text ids -> speech tokens (``lm``) -> mel (``flow``) -> 24 kHz waveform (``hift``)."""

    def __init__(self, config: CosyVoice2Config) -> None:
        super().__init__()
        self.config = config
        self.lm = TextSpeechLM(config.lm)
        self.flow = TokenToMelFlow(config.flow)
        self.hift = HiFTGenerator(config.hift)
