"""A mid-size CosyVoice 2 with random weights, shared by the benchmarks (no download needed).

Sizes (about 1/4 of the release in width): Qwen2 LM 384-d, 6 layers, 6 heads / 2 KV heads, FFN 1024;
flow encoder 256-d, 4 heads, FFN 1024, 3 + 4 blocks; U-Net 128 channels, 2 heads x 64, 2 blocks per level,
4 mid blocks; HiFT 128 base channels. Everything else (rates, chunking, 10 Euler steps, CFG) as released.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch

from cadenza.engine.cosyvoice2 import CosyVoice2Engine
from cadenza.engine.request import SynthesisRequest
from cadenza.engine.scheduler import SchedulerConfig
from cadenza.engine.stream_schedule import StreamSchedule
from cadenza.models.cosyvoice2.config import (
    CosyVoice2Config,
    EstimatorConfig,
    FlowConfig,
    FlowEncoderConfig,
    HiFTConfig,
    LMConfig,
    Qwen2Config,
)
from cadenza.models.cosyvoice2.model import CosyVoice2Model
from cadenza.models.cosyvoice2.speakers import SpeakerStore

TOKENS_PER_SECOND = 25


def midsize_config() -> CosyVoice2Config:
    qwen = Qwen2Config(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2,
                       intermediate_size=1024, vocab_size=4000)
    lm = LMConfig(qwen=qwen, llm_input_size=384, llm_output_size=384)
    flow = FlowConfig(
        input_size=256,
        encoder=FlowEncoderConfig(input_size=256, output_size=256, attention_heads=4, linear_units=1024, num_blocks=3),
        estimator=EstimatorConfig(channels=(128,), attention_head_dim=64, n_blocks=2, num_mid_blocks=4, num_heads=2),
    )
    return dataclasses.replace(CosyVoice2Config(), lm=lm, flow=flow,
                               hift=HiFTConfig(base_channels=128, f0_cond_channels=128))


def random_model(config: CosyVoice2Config, seed: int = 0) -> CosyVoice2Model:
    """Random weights for ``config``, the LM's scaled up so that its distribution is not flat."""
    torch.manual_seed(seed)  # benchmarks only; the library never seeds the global RNG
    model = CosyVoice2Model(config).eval()
    with torch.no_grad():
        for p in model.lm.parameters():
            p.mul_(3.0)
    return model


def stream_together(engine: CosyVoice2Engine, requests: list[SynthesisRequest]) -> tuple[list[int], list[float], float]:
    """Stream ``requests`` at once, one consumer thread each: (samples per request, seconds to each first chunk,
    wall seconds for all)."""
    n = len(requests)
    produced, first = [0] * n, [0.0] * n
    start = time.perf_counter()

    def consume(i: int) -> None:
        for k, chunk in enumerate(engine.stream(requests[i])):
            if k == 0:
                first[i] = time.perf_counter() - start
            produced[i] += len(chunk)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return produced, first, time.perf_counter() - start


def midsize_engine(schedule: StreamSchedule | None = None, max_active: int = 8, seed: int = 0,
                   **scheduler: int | str | bool | None) -> CosyVoice2Engine:
    """The mid-size engine; ``scheduler``: further ``SchedulerConfig`` fields (e.g. ``vocoder_workers``)."""
    model = random_model(midsize_config(), seed)
    return CosyVoice2Engine(model, frontend=None, speakers=SpeakerStore(None), schedule=schedule,
                            scheduler_config=SchedulerConfig(max_active=max_active, max_queued=64, **scheduler))


def fixed_length_request(engine: CosyVoice2Engine, seconds: float, seed: int) -> SynthesisRequest:
    """A request that makes exactly ``seconds`` of audio: eos is masked until, and forced at, that length."""
    n_tokens = int(seconds * TOKENS_PER_SECOND)
    text = torch.randint(0, engine.config.lm.qwen.vocab_size, (1, max(1, n_tokens // 10)), generator=torch.Generator().manual_seed(seed))
    req = engine.build(text_ids=text, voice=None, mode="benchmark", seed=seed)
    req.min_tokens = req.max_tokens = n_tokens
    return req
