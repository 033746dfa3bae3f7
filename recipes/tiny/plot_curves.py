"""Plot the training curves of every cadenza-tiny stage from WORK/runs/*/metrics.jsonl into one PNG.

    python recipes/tiny/plot_curves.py --work WORK --out docs/images/cadenza-tiny-training.png   (needs matplotlib)
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
    "lm": ("text-speech LM", [("loss", "cross-entropy")], "acc"),
    "flow": ("flow matching", [("loss", "flow-matching MSE")], None),
    "hift": ("HiFT vocoder (+ refinement)", [("loss_mel", "mel L1")], "loss_f0"),
}


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _rows(work: Path, stage: str) -> list[dict]:
    """A stage's metrics; HiFT continues with its refinement run (steps shifted to follow on)."""
    rows = _read(work / "runs" / stage / "metrics.jsonl")
    if stage == "hift":
        last = rows[-1]["step"] if rows else 0
        rows += [{**r, "step": r["step"] + last} for r in _read(work / "runs" / "hift_refine" / "metrics.jsonl")]
    return rows


def plot(work: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for ax, (stage, (title, series, extra)) in zip(axes, PANELS.items()):
        rows = _rows(work, stage)
        for (key, label), color in zip(series, ("tab:blue", "tab:green")):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts), label=label, color=color)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if extra:
            pts = [(r["step"], r[extra]) for r in rows if extra in r and r[extra] is not None]
            if pts:
                twin = ax.twinx()
                twin.plot(*zip(*pts), color="tab:orange", marker="o" if len(pts) < 20 else None, label=extra)
                twin.set_ylabel(extra, color="tab:orange", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.suptitle("cadenza-tiny: training curves (recipes/tiny, 2-core CPU)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args()
    plot(a.work, a.out)


if __name__ == "__main__":
    main()
