"""A small random-weight CosyVoice 2 (no fixtures needed) and random voice prompts for it, shared by engine and flow
tests; ``small_training_model``: the ``model:`` section of a training config for a small model."""

from __future__ import annotations

import dataclasses

import torch

from cadenza.models.cosyvoice2.config import (
    CFMConfig,
    CosyVoice2Config,
    EstimatorConfig,
    FlowConfig,
    FlowEncoderConfig,
    HiFTConfig,
    LMConfig,
    Qwen2Config,
)
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt


def small_training_model(num_mid_blocks: int = 1) -> dict:
    """A training config's ``model:`` section (the official layout, shrunk) for stage tests."""
    return {
        "config": "official",
        "qwen": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 64, "vocab_size": 100},
        "overrides": {
            "llm": {"speech_token_size": 50},
            "flow": {"vocab_size": 50, "input_size": 32,
                     "encoder": {"input_size": 32, "output_size": 32, "attention_heads": 2, "linear_units": 64,
                                 "num_blocks": 1, "static_chunk_size": 4},
                     "decoder": {"estimator": {"channels": [32], "attention_head_dim": 16, "n_blocks": 1,
                                               "num_mid_blocks": num_mid_blocks, "num_heads": 2,
                                               "static_chunk_size": 8}}},
        },
    }


def small_model() -> CosyVoice2Model:
    qwen = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=64, vocab_size=100)
    flow = FlowConfig(
        input_size=32, spk_embed_dim=16,
        encoder=FlowEncoderConfig(input_size=32, output_size=32, attention_heads=2, linear_units=64, num_blocks=1,
                                  num_up_blocks=1),
        estimator=EstimatorConfig(channels=(32,), attention_head_dim=16, n_blocks=1, num_mid_blocks=1, num_heads=2),
        cfm=CFMConfig(n_timesteps=2, noise_frames=2000),
    )
    cfg = dataclasses.replace(CosyVoice2Config(), lm=LMConfig(qwen=qwen, llm_input_size=32, llm_output_size=32),
                              flow=flow, hift=HiFTConfig(base_channels=32, f0_cond_channels=16))
    torch.manual_seed(0)
    model = CosyVoice2Model(cfg).eval()
    with torch.no_grad():  # a voiced f0 (> the 10 Hz threshold) on part of the frames: both source branches run
        model.hift.f0_predictor.classifier.bias.fill_(40.0)
    return model


def voice(model: CosyVoice2Model, prompt_tokens: int, seed: int) -> SpeakerPrompt:
    gen = torch.Generator().manual_seed(seed)
    flow = model.config.flow
    return SpeakerPrompt(
        prompt_text=torch.zeros(1, 0, dtype=torch.long),
        llm_prompt_speech=torch.zeros(1, 0, dtype=torch.long),
        flow_prompt_speech=torch.randint(0, flow.vocab_size, (1, prompt_tokens), generator=gen),
        prompt_mel=torch.randn(1, flow.token_mel_ratio * prompt_tokens, flow.output_size, generator=gen),
        embedding=torch.randn(1, flow.spk_embed_dim, generator=gen),
    )


def decode_rows(model: CosyVoice2Model, step, prompt_lengths: list[int], steps: int,
                device: str = "cpu") -> tuple[torch.Tensor, list]:
    """Prefill one request per prompt length (random embeddings, its own forward), then ``steps`` batched decode
    steps through ``step`` (an ``engine.lm_decode.DecodeStep``): the log-probs ``[steps, B, V]`` and the caches."""
    lm, hidden = model.lm, model.config.lm.llm_input_size
    gen = torch.Generator().manual_seed(7)
    caches, outs = [], []
    with torch.inference_mode():
        for n in prompt_lengths:
            cache = step.new_cache() or model.lm.new_cache()
            lm.forward_hidden(torch.randn(1, n, hidden, generator=gen).to(device), cache=cache)
            caches.append(cache)
        for _ in range(steps):
            outs.append(step(torch.randn(len(caches), 1, hidden, generator=gen).to(device), caches))
    return torch.stack(outs), caches
