"""One GAN step of the vocoder's training stage (``training/hift_stage.py``) against the plain formulation of the same
step, timed in one run: seconds per step and their ratio.

The stage's step runs the generator once for both turns and, in the generator's turn, scores the real crops without
a graph and the generated ones with the discriminator's weights held out of the backward. The plain formulation,
built here from the stage's own modules, losses and optimisers, is what the stage did before (and what the
reference's recipe does): a second generator forward after the discriminator's update, and real and generated crops
scored together by a trainable discriminator. Both give the generator the same gradient
(``tests/training/test_hift_gan_step.py``), so the ratio is pure speed.

Sizes: ``tiny`` is cadenza-tiny's vocoder round on a CPU (a 128-channel generator, the CPU-narrow discriminators with
the frame-period ones, 0.4 s crops, batch 6: ``recipes/tiny/configs/hift_joe_pitch.yaml``'s shapes); ``release`` the
released HiFT (512 channels) with the reference's discriminator widths. Audio is synthetic (gliding harmonic vowels
over noise): the arithmetic of a step does not depend on it. Steps of the two kinds alternate, so a noisy machine
slows both alike; medians are reported, the ratio last.

    python benchmarks/hift_train_step.py [--size tiny|release] [--steps 6] [--warmup 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.audio.mel import flow_prompt_mel
from cadenza.training.hift.data import crop_batch
from cadenza.training.hift.losses import discriminator_adv_loss, tpr_loss
from cadenza.training.hift_stage import HiFTStage

SR = 24000
SIZES = {
    "tiny": {"model": {"hift": {"base_channels": 128, "f0_predictor": {"cond_channels": 128}}},
             "discriminator": {"periods": [2, 3, 5, 7, 11, 240, 480], "period_channels": [16, 32, 64, 64],
                               "resolutions": [[1024, 120, 600], [2048, 240, 1200], [512, 50, 240]],
                               "spec_channels": 16},
             "segment_samples": 9600, "batch": 6},
    "release": {"model": {}, "discriminator": {}, "segment_samples": 9600, "batch": 6},
}


def write_corpus(d: Path, count: int, seconds: float) -> None:
    """``count`` utterances of gliding harmonic vowels over faint noise, as a manifest folder."""
    (d / "wavs").mkdir()
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * SR)) / SR
    rows = []
    for i in range(count):
        f0 = 90 + 15 * i + 30 * np.sin(2 * math.pi * 0.7 * t)
        phase = 2 * math.pi * np.cumsum(f0) / SR
        wav = 0.3 * sum(np.sin(k * phase) / k for k in range(1, 12)) + 0.01 * rng.standard_normal(t.size)
        sf.write(d / "wavs" / f"{i}.wav", wav.astype(np.float32), SR)
        rows.append({"audio": f"wavs/{i}.wav", "text": "a vowel", "speaker": "s"})
    (d / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def plain_step(stage: HiFTStage, batch: list[dict], step: int) -> None:
    """The same GAN step in the plain formulation (module docstring)."""
    cfg, lc = stage.model_cfg, stage.loss_cfg
    crops = crop_batch(batch, stage.cfg.segment_samples, cfg.hop_length, cfg.nb_harmonics + 1, stage.train_cfg.seed,
                       step, stage.cfg.speed_perturb, stage.cfg.speed_perturb_share)
    speech, f0_target = crops.speech, crops.f0
    source_f0 = f0_target if stage.cfg.source_f0 == "target" else None
    with torch.no_grad():
        mel = flow_prompt_mel(speech, stage.mel_cfg)
        fake, _ = stage.g_forward(mel, crops.rand_ini, crops.sine_noise, source_f0)
    real_scores, fake_scores, _, _ = stage.d_forward(speech, fake)
    loss_d = discriminator_adv_loss(real_scores, fake_scores) + lc.tpr_weight * tpr_loss(real_scores, fake_scores,
                                                                                           lc.tpr_tau)
    stage.opt_d.step(loss_d)
    fake, f0_pred = stage.g_forward(mel, crops.rand_ini, crops.sine_noise, source_f0)
    scores = stage.d_forward(speech, fake)
    loss_g, _ = stage._generator_loss(speech, fake, f0_pred, f0_target, *scores)
    stage.opt_g.step(loss_g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=tuple(SIZES), default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_corpus(data, size["batch"], 1.0)
        config = {"train": {"batch_size": size["batch"], "optim": {"lr": 1e-4, "betas": [0.8, 0.99]}},
                  "model": {"config": "official", "overrides": size["model"]},
                  "hift": {"segment_samples": size["segment_samples"], "discriminator": size["discriminator"]}}
        stage = HiFTStage(config, data)
        stage.setup(torch.device("cpu"), lambda m: m)
        batch = [stage.dataset()[i] for i in range(size["batch"])]
        times: dict[str, list[float]] = {"stage": [], "plain": []}
        for i in range(args.warmup + args.steps):
            for name, run in (("stage", stage.train_step), ("plain", lambda b, s: plain_step(stage, b, s))):
                t = time.perf_counter()
                run(batch, i)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t)
    stage_s, plain_s = statistics.median(times["stage"]), statistics.median(times["plain"])
    print(f"size {args.size}, batch {size['batch']} x {size['segment_samples']} samples, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"plain_step_s: {plain_s:.3f}")
    print(f"stage_step_s: {stage_s:.3f}")
    print(f"stage_over_plain: {stage_s / plain_s:.3f}")


if __name__ == "__main__":
    main()
