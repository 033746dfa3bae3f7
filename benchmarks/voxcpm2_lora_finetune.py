"""LoRA fine-tuning of the fixture-size VoxCPM 2 on a few minutes of one voice: held-out loss, speaker similarity and
seconds per step, before and after, in one run (docs/voxcpm2.md, "Fine-tuning, measured").

    python benchmarks/voxcpm2_lora_finetune.py --corpus CORPUS/manifest.jsonl --speaker joe --work /tmp/vx2-ft \\
        [--minutes 4] [--heldout 16] [--steps 300] [--lr 1e-3] [--threads 1]

``--corpus``: a JSON-lines manifest (``audio`` relative to it, ``text``, optional ``speaker``), e.g. the teacher
corpus ``recipes/tiny/aligned_corpus.py`` makes. The first ``--minutes`` of the speaker's clips train, its last
``--heldout`` clips are held out. The model is the fixtures' ``tiny_model`` (random weights, including its AudioVAE);
the run is ``cadenza train voxcpm2``'s (the launcher, the release's LoRA recipe: rank 32, alpha 32 on both LMs and the
LocDiT, AdamW, warm-up then cosine, 16 clips a step in 8 micro-batches), with ``--steps``, ``--lr`` and float32
(``mixed_precision: no``, faster at this size) as given.

Measured, base model (the adapter before its first step is zero) against the fine-tuned adapter:

* held-out loss (diffusion + stop), with the trainer's fixed evaluation draws;
* speaker similarity (Resemblyzer GE2E cosine, ``cadenza[eval]``) of plain-text synthesis of the held-out texts.
  A random AudioVAE cannot render anybody's voice (its output is not speech: the usual voice-activity trimming
  finds none), so the target is the voice *as this VAE renders it*: the decoded latents of the held-out recordings
  (``decode(encode(clip))``). Embeddings skip the silence trimming (loudness-normalised only). The cosine to the
  real recordings is printed too;
* latent statistics: the distance of the generated latent frames' per-dimension mean and standard deviation from
  those of the held-out recordings' latents (sum of squares), and the mean |log| duration ratio to the recordings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.evaluation.audio import load_16k, to_16k_mono
from cadenza.training import launcher
from cadenza.training.voxcpm2.stage import VoxCPM2Stage, default_config

FIXTURE = Path(__file__).resolve().parents[1] / "../shared/fixtures/voxcpm2/tiny_model"


def split_corpus(corpus: Path, speaker: str | None, minutes: float, heldout: int, out: Path) -> tuple[list, list]:
    """Write ``train.jsonl`` (the first ``minutes`` of the speaker) and ``val.jsonl`` (its last ``heldout`` clips)."""
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if speaker is None or r.get("speaker") == speaker]
    for r in rows:
        r["audio"] = str((corpus.parent / r["audio"]).resolve())
    held, rest = rows[-heldout:], rows[:-heldout]
    train, total = [], 0.0
    for r in rest:
        if total >= minutes * 60:
            break
        train.append(r)
        total += sf.info(r["audio"]).duration
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.jsonl", train), ("val.jsonl", held)):
        (out / name).write_text("".join(json.dumps({"audio": r["audio"], "text": r["text"]}) + "\n" for r in part))
    print(f"train: {len(train)} clips, {total / 60:.1f} min; held out: {len(held)} clips")
    return train, held


def run_config(args: argparse.Namespace) -> dict:
    config = default_config("lora")
    eval_every = max(10, args.steps // 5 // 10 * 10)
    config["train"].update({"max_steps": args.steps, "ckpt_every": args.steps, "log_every": 10,
                            "mixed_precision": "no", "progress": False})
    config["train"]["optim"].update({"lr": args.lr, "warmup_steps": min(100, args.steps // 10)})
    config["voxcpm2"].update({"init": str(FIXTURE), "manifest": "train.jsonl", "val_manifest": "val.jsonl",
                              "eval_every": eval_every, "eval_max_items": args.heldout})
    return config


def _encoder():
    from cadenza.evaluation.speaker_similarity import load_encoder

    return load_encoder()


def embed_raw(wav: np.ndarray, sr: int) -> np.ndarray:
    """GE2E embedding without silence trimming (loudness-normalised only), unit length."""
    from resemblyzer.audio import normalize_volume

    audio = normalize_volume(to_16k_mono(wav, sr), -30, increase_only=True)
    return np.asarray(_encoder().embed_utterance(audio), dtype=np.float64)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def latent_stats(frames: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std of latent frames ``[n, D]``."""
    x = frames.double().numpy()
    return x.mean(0), x.std(0)


def evaluate_voice(args: argparse.Namespace, held: list, out: Path) -> dict:
    engine = VoxCPM2Engine.from_pretrained(FIXTURE)
    engine.register_lora("ft", out)
    vae = engine.vae
    real, rendered, target_frames, target_s = [], [], [], []
    from cadenza.evaluation.speaker_similarity import embed

    with torch.inference_mode():
        for r in held:
            wav = load_16k(r["audio"])
            real.append(embed(wav, 16000, encoder=_encoder()))
            latents = vae.encode(torch.from_numpy(wav)[None], 16000)  # [1, D, T]
            target_frames.append(latents[0].T)
            target_s.append(wav.size / 16000)
            rendered.append(embed_raw(vae.decode(latents).squeeze().numpy(), vae.out_sample_rate))
    target_real, target_rendered = _unit(np.mean(real, 0)), _unit(np.mean(rendered, 0))
    t_mean, t_std = latent_stats(torch.cat(target_frames))
    result = {}
    for name, lora in (("base", None), ("lora", "ft")):
        sims, sims_real, frames, log_ratio = [], [], [], []
        for i, r in enumerate(held):
            request = engine.build(r["text"], seed=1000 + i, lora=lora, retry=False, max_len=256)
            audio = engine.synthesize(request)
            e = embed_raw(audio, engine.sample_rate)
            sims.append(float(_unit(e) @ target_rendered))
            sims_real.append(float(_unit(e) @ target_real))
            patches = request.outcome.result.patches  # [N, P, D]
            frames.append(patches.reshape(-1, patches.shape[-1]))
            log_ratio.append(abs(np.log(audio.size / engine.sample_rate / target_s[i])))
        g_mean, g_std = latent_stats(torch.cat(frames))
        result[name] = {"similarity_to_rendered_target": round(statistics.mean(sims), 4),
                        "similarity_to_real_target": round(statistics.mean(sims_real), 4),
                        "latent_stats_distance": round(float(((g_mean - t_mean) ** 2).sum()
                                                             + ((g_std - t_std) ** 2).sum()), 4),
                        "mean_abs_log_duration_ratio": round(statistics.mean(log_ratio), 3)}
    # The ceiling of the rendered-target similarity: one held-out clip's rendering against the others' mean
    result["rendered_clip_vs_rendered_target"] = round(statistics.mean(
        float(_unit(e) @ target_rendered) for e in rendered), 4)
    engine.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--speaker", default=None)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--heldout", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data, out = args.work / "data", args.work / "run"
    _, held = split_corpus(args.corpus, args.speaker, args.minutes, args.heldout, data)
    config = run_config(args)
    config_path = args.work / "config.json"
    config_path.write_text(json.dumps(config, indent=1))

    stage = VoxCPM2Stage(config, data)  # the base model's held-out loss, with the trainer's own evaluation
    stage.setup(torch.device("cpu"), lambda module: module)
    stage.dataset()  # also fills the latent cache the run reads
    before = stage.evaluate()
    del stage

    start = time.perf_counter()
    launcher.train("voxcpm2", config_path, data, out)
    wall = time.perf_counter() - start
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    plain_steps = [m["step_time_s"] for m in logged if "heldout_loss" not in m]
    curve = [(m["step"], round(m["heldout_loss"], 4)) for m in logged if "heldout_loss" in m]
    summary = {
        "heldout_loss_before": round(before["heldout_loss"], 4),
        "heldout_diff_before": round(before["heldout_diff"], 4),
        "heldout_stop_before": round(before["heldout_stop"], 4),
        "heldout_loss_curve": curve,
        "heldout_diff_after": round(logged[-1].get("heldout_diff", float("nan")), 4),
        "heldout_stop_after": round(logged[-1].get("heldout_stop", float("nan")), 4),
        "train_loss_first_last": [round(logged[0]["loss"], 4), round(logged[-1]["loss"], 4)],
        "step_s_median": round(statistics.median(plain_steps), 3) if plain_steps else None,
        "run_wall_s": round(wall, 1),
        "threads": args.threads,
        "load_average": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(summary))
    voice = evaluate_voice(args, held, out)
    print(json.dumps(voice))
    (args.work / "summary.json").write_text(json.dumps({**summary, **voice}, indent=1))


if __name__ == "__main__":
    main()
