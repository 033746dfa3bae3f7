"""VoxCPM 2 on CPU: our default precision (float32) against the reference's default dtype path (bf16 weights and
compute: the reference keeps config.json's ``"dtype": "bfloat16"`` on CPU), in one run.

Model: a mid-size random configuration (below: half the release's widths, 1/2-1/3 of its depths, the release's
patch size, latent width, head dim and FSQ scale; ~250 M parameters), so that the whole benchmark runs in well under three
minutes on two cores. The same weights are timed in both dtypes on the same prompt, with the same noise and a fixed
number of generated patches (the stop head is ignored), after a warm-up; the runs of the two dtypes are interleaved and
the best of each is kept, so load bursts on a shared machine do not decide the ratio. ``speedup`` = bf16 seconds per
patch / float32 seconds per patch.

The bf16 column runs *our* code in bf16, which reproduces the reference's bf16 arithmetic bit for bit on CPU (see
docs/voxcpm2.md); the reference itself is slower still, as it attends over its whole static KV cache
(``max_length`` positions) at every step. The AudioVAE always runs in float32 and is timed separately.

    python benchmarks/voxcpm2_cpu.py [--patches 12] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_config import AudioVAEConfig
from cadenza.models.voxcpm2.config import VoxCPM2Config
from cadenza.models.voxcpm2.generate import GenerationOptions, generate_latents
from cadenza.models.voxcpm2.layouts import build_layout
from cadenza.models.voxcpm2.model import VoxCPM2Model
from cadenza.models.voxcpm2.official_config import OFFICIAL_CONFIG

HEAD_DIM = 128  # the release's
MIDSIZE = {
    **OFFICIAL_CONFIG,
    "lm_config": {
        **OFFICIAL_CONFIG["lm_config"],
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 8,
        "num_key_value_heads": 1, "kv_channels": HEAD_DIM, "vocab_size": 8192, "max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0 + j / 4 for j in range(HEAD_DIM // 2)],
                         "short_factor": [1.0 + j / 8 for j in range(HEAD_DIM // 2)],
                         "original_max_position_embeddings": 4096},
    },
    "scalar_quantization_latent_dim": 256,
    "residual_lm_num_layers": 4,
    "encoder_config": {"hidden_dim": 512, "ffn_dim": 1536, "num_heads": 8, "num_layers": 6, "kv_channels": HEAD_DIM},
    "dit_config": {**OFFICIAL_CONFIG["dit_config"], "hidden_dim": 512, "ffn_dim": 1536, "num_heads": 8,
                   "num_layers": 6, "kv_channels": HEAD_DIM},
    "audio_vae_config": {**OFFICIAL_CONFIG["audio_vae_config"], "encoder_dim": 32, "decoder_dim": 256},
    "max_length": 2048,
}
PROMPT_TOKENS = 48


def time_generation(model: VoxCPM2Model, layout, options: GenerationOptions, seed: int) -> tuple[float, float, object]:
    """(seconds to the first patch, seconds per later patch, result)."""
    marks = []
    start = time.perf_counter()
    result = generate_latents(model, layout, options, noise=torch.Generator().manual_seed(seed),
                              on_step=lambda step: marks.append(time.perf_counter()))
    first = marks[0] - start
    per_patch = (marks[-1] - marks[0]) / max(1, len(marks) - 1)
    return first, per_patch, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=12, help="patches per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per dtype, interleaved; the best is kept")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a stable per-core comparison; 0 keeps torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # random weights (this script only; the library never seeds the global RNG)
    config = VoxCPM2Config.from_dict(MIDSIZE, source="benchmark config")
    base = VoxCPM2Model(config).eval()
    vae = AudioVAE(AudioVAEConfig.from_dict(MIDSIZE["audio_vae_config"])).eval()
    n_params = sum(p.numel() for p in base.parameters())
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, config.lm_config.vocab_size, (PROMPT_TOKENS,), generator=gen).tolist()
    layout = build_layout(ids, config.patch_size, config.feat_dim, special=config.special_tokens)
    options = GenerationOptions(min_len=args.patches, max_len=args.patches)

    runs = {"float32 (our CPU default)": torch.float32, "bfloat16 (reference default)": torch.bfloat16}
    models = {}
    for label, dtype in runs.items():
        model = VoxCPM2Model(config).eval()
        model.load_state_dict(base.state_dict())
        models[label] = model.to(dtype)
        time_generation(models[label], layout, GenerationOptions(min_len=2, max_len=2), seed=0)  # warm-up
    best: dict[str, list[float]] = {label: [math.inf, math.inf, math.inf] for label in runs}
    results = {}
    for _ in range(args.rounds):  # interleaved, so a burst of load on a shared machine hits both alike
        for label, model in models.items():
            first, per_patch, results[label] = time_generation(model, layout, options, seed=2)
            with torch.inference_mode():
                t0 = time.perf_counter()
                vae.decode(results[label].latents)
                vae_s = time.perf_counter() - t0
            best[label] = [min(a, b) for a, b in zip(best[label], (first, per_patch, vae_s))]

    audio_s = args.patches * config.patch_size / (vae.sample_rate / vae.hop_length)
    print(f"VoxCPM 2 mid-size random model: {n_params / 1e6:.1f} M parameters (LM {config.lm_config.hidden_size}x"
          f"{config.lm_config.num_hidden_layers}, RALM x{config.residual_lm_num_layers}, LocEnc/LocDiT "
          f"{config.encoder_config.hidden_dim}x{config.encoder_config.num_layers}/{config.dit_config.num_layers}), "
          f"prompt {len(layout)} positions, {args.patches} patches x 10 Euler steps, {torch.get_num_threads()} "
          f"thread(s), best of {args.rounds} interleaved runs")
    print(f"{'precision':<30} {'first patch s':>14} {'s / patch':>10} {'RTF (LM+DiT)':>13} {'VAE decode s':>13}")
    for label, (first, per_patch, vae_s) in best.items():
        rtf = (first + per_patch * (args.patches - 1)) / audio_s
        print(f"{label:<30} {first:>14.3f} {per_patch:>10.4f} {rtf:>13.3f} {vae_s:>13.3f}")
    fp32, bf16 = (results[label].patches for label in runs)
    print(f"max |fp32 - bf16| over the generated latents: {float((fp32 - bf16).abs().max()):.3g} "
          "(same weights, same noise)")
    f32_label, bf16_label = runs
    print(f"speedup_vs_bf16_default: {best[bf16_label][1] / best[f32_label][1]:.2f}")


if __name__ == "__main__":
    main()
