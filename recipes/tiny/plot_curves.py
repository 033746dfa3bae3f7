"""Plot the training curves of every cadenza-tiny stage from WORK/runs/*/metrics.jsonl into one PNG.

    python recipes/tiny/plot_curves.py --work WORK --out docs/images/cadenza-tiny-training.png   (needs matplotlib)
    python recipes/tiny/plot_curves.py --work WORK --stages lm_phoneme flow_phoneme frame_tokenizer --out ...  (v2)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# stage -> (title, [(metric, label)], secondary metric or None)
PANELS = {
    "tokenizer": ("speech tokenizer (FSQ + CTC)", [("ctc_loss", "CTC loss"), ("mel_l1", "mel L1 (aux)")],
                  "heldout_cer"),
    "speaker": ("speaker encoder (AAM-softmax)", [("loss", "loss")], "heldout_eer"),
    "lm": ("text-speech LM", [("loss", "cross-entropy"), ("heldout_ce", "held-out cross-entropy")], "acc"),
    "flow": ("flow matching", [("loss", "flow-matching MSE")], None),
    "hift": ("HiFT vocoder (warm-up, refinement, GAN)", [("loss_mel", "mel L1")], "loss_f0"),
    # v2 (--design v2)
    "lm_phoneme": ("phoneme LM", [("loss", "cross-entropy"), ("heldout_ce", "held-out cross-entropy")],
                   "heldout_acc"),
    "flow_phoneme": ("flow (+ encoder prior from step 600)", [("loss", "loss")], None),
    "frame_tokenizer": ("frame tokenizer", [("loss", "cross-entropy")], "heldout_frame_acc"),
}
V2_STAGES = ["lm_phoneme", "flow_phoneme", "frame_tokenizer"]


# stage -> its runs in training order: the first continues from a fresh start, the others from the one before.
# "resume" runs continue the previous run's own step count (a checkpoint was carried over); "warm" runs start at step
# 0 from the previous run's exported weights and are drawn shifted to follow on.
CHAINS = {
    "tokenizer": [("tokenizer", None), ("tokenizer_v2", "resume")],
    "speaker": [("speaker", None)],
    "lm": [("lm", None), ("lm_v2", "warm"), ("lm_v3", "warm")],
    "flow": [("flow", None), ("flow_v2", "warm"), ("flow_v3", "warm")],
    "hift": [("hift", None), ("hift_refine", "warm"), ("hift_gan", "warm")],
    "lm_phoneme": [("lm_phoneme", None)],
    "flow_phoneme": [("flow_phoneme", None), ("flow_phoneme_r2", "warm")],
    "frame_tokenizer": [("frame_tokenizer", None)],
}


def _read(path: Path) -> list[dict]:
    """A run's metrics; where the run was resumed after a stop, the rows logged past its last checkpoint (and
    logged again after the resume) are kept only once, from the resumed process."""
    rows: list[dict] = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            row = json.loads(line)
            while rows and rows[-1]["step"] >= row["step"]:
                rows.pop()
            rows.append(row)
    return rows


def _rows(work: Path, stage: str) -> list[dict]:
    """A stage's metrics over all its runs (CHAINS), on one step axis."""
    rows: list[dict] = []
    for name, how in CHAINS[stage]:
        run = _read(work / "runs" / name / "metrics.jsonl")
        if not run:
            continue
        if how == "resume":
            rows = [r for r in rows if r["step"] < run[0]["step"]]
        last = rows[-1]["step"] if rows and how == "warm" else 0
        rows += [{**r, "step": r["step"] + last, "run": name} for r in run]
    return rows


def plot(work: Path, out: Path, stages: list[str] | None = None, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {k: v for k, v in PANELS.items() if (k not in V2_STAGES if stages is None else k in stages)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (stage, (name, series, extra)) in zip(axes[0], panels.items()):
        rows = _rows(work, stage)
        for (key, label), color in zip(series, ("tab:blue", "tab:green")):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), label=label, color=color)
        for before, after in zip(rows, rows[1:]):  # where the next run (round) of the stage begins
            if before["run"] != after["run"]:
                ax.axvline(after["step"], color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if extra:
            pts = [(r["step"], r[extra]) for r in rows if extra in r and r[extra] is not None]
            if pts:
                twin = ax.twinx()
                twin.plot(*zip(*pts), color="tab:orange", marker="o" if len(pts) < 20 else None, label=extra,
                          alpha=0.6)
                twin.set_ylabel(extra, color="tab:orange", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title or "cadenza-tiny: training curves (recipes/tiny, 2-core CPU; dashed: the next run of a stage "
                          "begins)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--stages", nargs="+", choices=list(PANELS), default=None, help="panels to draw (default: all)")
    p.add_argument("--title", default=None)
    a = p.parse_args()
    plot(a.work, a.out, a.stages, a.title)


if __name__ == "__main__":
    main()
