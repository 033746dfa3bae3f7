"""Per-chunk cost of streaming the CosyVoice 2 flow: incremental (cached) vs. recomputing the prefix.

Builds a mid-size flow with random weights (config below), synthesises a 30 s utterance (750 speech tokens after a
2.5 s prompt of 62 tokens) chunk by chunk with the reference hop schedule (25 + prompt pad = 38, 50, 100, 100, ...,
3 look-ahead tokens, a final flush) and times every chunk twice, in the same run:

* incremental: ``IncrementalFlow.push`` (each chunk computes only its own frames, from cached state);
* recompute (reference behaviour): ``flow.inference(prompt + all tokens so far, streaming=True, finalize=False)``,
  keeping the new frames.

Cost per token: a chunk's wall time divided by the tokens whose frames it computed. For the incremental path that
is the chunk's new tokens, plus the prompt in the first chunk (the prompt's frames are computed there); for the
recompute path it is the chunk's new tokens (the prefix it recomputes is the overhead we measure). The last line is
``last_over_first_chunk_cost`` of the incremental path: cost per token of the last full-size (100-token) chunk over
the first chunk's; the line before gives the recompute path's ratio for contrast.

Run: ``python benchmarks/stream_chunk_cost.py`` (single thread; about two minutes on a laptop-class CPU).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace

import torch

from cadenza.models.cosyvoice2.config import CFMConfig, EstimatorConfig, FlowConfig, FlowEncoderConfig
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.models.cosyvoice2.flow_incremental import IncrementalFlow

# Mid-size flow: encoder 256-d, 4 heads, FFN 1024, 3 + 4 conformer blocks; estimator U-Net with 128 channels,
# 2 heads x 64, 2 transformer blocks per stack, 4 mid blocks; everything else as released (chunks 25 tokens /
# 50 frames, look-ahead 3, 10 Euler steps, 80 mel bins, 6561 speech tokens).
BENCH_FLOW = FlowConfig(
    vocab_size=6561,
    input_size=256,
    output_size=80,
    spk_embed_dim=192,
    token_mel_ratio=2,
    pre_lookahead_len=3,
    encoder=FlowEncoderConfig(
        input_size=256, output_size=256, attention_heads=4, linear_units=1024, num_blocks=3, num_up_blocks=4,
        upsample_stride=2, pre_lookahead_len=3, static_chunk_size=25,
    ),
    estimator=EstimatorConfig(
        in_channels=320, out_channels=80, channels=(128,), attention_head_dim=64, n_blocks=2, num_mid_blocks=4,
        num_heads=2, static_chunk_size=50,
    ),
    cfm=CFMConfig(n_timesteps=10),
)
HOP, MAX_HOP, SCALE = 25, 100, 2  # reference schedule (docs/design.md, "CosyVoice 2 streaming schedule")


def hop_schedule(prompt_tokens: int, n_tokens: int, lookahead: int) -> list[int]:
    """Non-final chunk sizes of the reference schedule; the remaining tokens form the final chunk."""
    hops, offset, base = [], 0, HOP
    hop = HOP + math.ceil(prompt_tokens / HOP) * HOP - prompt_tokens
    while offset + hop + lookahead <= n_tokens:
        hops.append(hop)
        offset += hop
        base = min(MAX_HOP, base * SCALE)
        hop = base
    return hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=750, help="speech tokens to synthesise (25 per second)")
    parser.add_argument("--prompt-tokens", type=int, default=62)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the incremental path (per-chunk medians)")
    parser.add_argument("--reserve-tokens", type=int, default=0,
                        help="IncrementalFlow(reserve_tokens=...): pre-size the key/value buffers (default: grow)")
    parser.add_argument("--left-chunks", type=int, default=-1,
                        help="estimator num_decoding_left_chunks (-1 = all, as released; >= 0 bounds attention "
                             "but changes the output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # random weights must not hit the slow denormal path
    gen = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    config = BENCH_FLOW
    if args.left_chunks >= 0:
        config = replace(config, estimator=replace(config.estimator, num_decoding_left_chunks=args.left_chunks))
    flow = TokenToMelFlow(config).eval()
    cfg = flow.cfg
    la = cfg.pre_lookahead_len
    prompt_token = torch.randint(0, cfg.vocab_size, (1, args.prompt_tokens), generator=gen)
    prompt_feat = torch.randn(1, cfg.token_mel_ratio * args.prompt_tokens, cfg.output_size, generator=gen)
    embedding = torch.randn(1, cfg.spk_embed_dim, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=gen)
    hops = hop_schedule(args.prompt_tokens, args.tokens, la)
    chunks = hops + [args.tokens - sum(hops)]

    # Warm-up of both paths on a separate session (same chunk sizes as the first two chunks): a cold first chunk pays
    # the allocator's first touches and would make the first chunk look dearer, the ratio better, than in a running
    # engine, where every request's first chunk is warm.
    flow.inference(tokens[:, :30], prompt_token, prompt_feat, embedding, streaming=True, finalize=False)
    with torch.inference_mode(), IncrementalFlow(flow, prompt_token, prompt_feat, embedding) as warm:
        end = chunks[0] + chunks[1]
        warm.push(tokens[:, : chunks[0]], tokens[:, chunks[0] : chunks[0] + la])
        warm.push(tokens[:, chunks[0] : end], tokens[:, end : end + la])
        warm.push(tokens[:, end : end + la], final=True)
    rows, worst = [], 0.0
    with torch.inference_mode(), IncrementalFlow(flow, prompt_token, prompt_feat, embedding,
                                                       reserve_tokens=args.reserve_tokens) as session:
        offset = 0
        for k, n in enumerate(chunks):
            final = k == len(chunks) - 1
            end = offset + n
            t0 = time.perf_counter()
            mel = session.push(tokens[:, offset:end], None if final else tokens[:, end : end + la], final=final)
            t_inc = time.perf_counter() - t0
            t0 = time.perf_counter()
            ref = flow.inference(tokens[:, : end if final else end + la], prompt_token, prompt_feat, embedding,
                                 streaming=True, finalize=final)[:, :, cfg.token_mel_ratio * offset :]
            t_rec = time.perf_counter() - t0
            worst = max(worst, float((mel - ref).abs().max()))
            computed = n + (args.prompt_tokens if k == 0 else 0)
            rows.append([k, offset, n, computed, [t_inc], t_rec, "final" if final else ""])
            offset = end
        cache_mb = session.nbytes / 2**20
    for _ in range(args.repeats - 1):  # the incremental path again (cheap): per-chunk medians resist the noise
        with torch.inference_mode(), IncrementalFlow(flow, prompt_token, prompt_feat, embedding,
                                                           reserve_tokens=args.reserve_tokens) as session:
            for row, n in zip(rows, chunks):
                offset, final = row[1], row[6] == "final"
                end = offset + n
                t0 = time.perf_counter()
                session.push(tokens[:, offset:end], None if final else tokens[:, end : end + la], final=final)
                row[4].append(time.perf_counter() - t0)
    for row in rows:
        row[4] = statistics.median(row[4])

    print(f"flow: encoder {cfg.encoder.output_size}-d x{cfg.encoder.num_blocks}+{cfg.encoder.num_up_blocks} blocks, "
          f"estimator {cfg.estimator.channels} ch x{cfg.estimator.num_mid_blocks} mid; prompt {args.prompt_tokens} "
          f"tokens, {args.tokens} tokens; torch threads 1; incremental: median of {args.repeats} runs")
    print(f"{'chunk':>5} {'offset':>6} {'new':>4} {'computed':>8} | {'incr ms':>8} {'ms/token':>8} | "
          f"{'recomp ms':>9} {'ms/new tok':>10}")
    for k, offset, n, computed, t_inc, t_rec, note in rows:
        print(f"{k:>5} {offset:>6} {n:>4} {computed:>8} | {1e3 * t_inc:8.1f} {1e3 * t_inc / computed:8.3f} | "
              f"{1e3 * t_rec:9.1f} {1e3 * t_rec / n:10.3f} {note}")
    total_inc, total_rec = sum(r[4] for r in rows), sum(r[5] for r in rows)
    print(f"total: incremental {total_inc:.2f} s, recompute {total_rec:.2f} s; max |incremental - recompute| "
          f"{worst:.2e}; cache before close {cache_mb:.1f} MiB")
    full = [r for r in rows if r[2] == MAX_HOP and not r[6]]
    first, last = rows[0], (full[-1] if full else rows[-1])
    print(f"recompute_last_over_first_chunk_cost: {(last[5] / last[2]) / (first[5] / first[2]):.2f}")
    print(f"last_over_first_chunk_cost: {(last[4] / last[3]) / (first[4] / first[3]):.2f}")


if __name__ == "__main__":
    main()
