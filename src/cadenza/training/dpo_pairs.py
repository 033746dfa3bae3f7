"""Preference pairs for the ``dpo`` stage: reading, checking and building them.

File format (JSONL, one pair per line, default ``DATA/preference_pairs.jsonl``)::

    {"id": "utt42", "text_ids": [..] and/or "text": "...", "chosen": [speech ids], "rejected": [speech ids],
     "speaker": "optional", "chosen_reward": 0.97, "rejected_reward": 0.41, "chosen_seed": 7, "rejected_seed": 3}

``chosen`` and ``rejected`` are speech-token sequences for the *same* text (e.g. sampled from the LM being tuned); which
one is preferred is the data's decision — typically a reward such as ``1 - WER`` of an ASR transcript of the synthesised
audio, or speaker similarity to the prompt (docs/design.md, "CosyVoice 2 training objectives"). ``make_pairs`` turns
scored candidates into pairs (best vs worst of each text, if their rewards differ by at least ``min_gap``). Rewards are
stored for reference only; training does not read them. ``text`` is kept beside ``text_ids`` when both are given (the
``asr_reward`` stage reads it as the transcript). ``cadenza data dpo-pairs`` (``preference_candidates.py``) makes
such a file from a model and a list of texts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cadenza.errors import InputError

log = logging.getLogger(__name__)


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ValueError(f"{what} must be a non-empty list of non-negative integers")
    return value


def check_pair(entry: Any) -> dict[str, Any]:
    """A validated pair (``text_ids`` or ``text``, ``chosen``, ``rejected``); raises ``ValueError`` with the reason."""
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    pair = {"id": str(entry.get("id", "")), "speaker": str(entry.get("speaker") or ""),
            "chosen": _ids(entry.get("chosen"), "chosen"), "rejected": _ids(entry.get("rejected"), "rejected")}
    has_text = isinstance(entry.get("text"), str) and bool(entry["text"].strip())
    if "text_ids" in entry:
        pair["text_ids"] = _ids(entry["text_ids"], "text_ids")
    elif not has_text:
        raise ValueError("needs text_ids or a non-empty text")
    if has_text:  # kept beside text_ids too: the asr_reward stage's CTC target
        pair["text"] = entry["text"].strip()
    for key in ("chosen_reward", "rejected_reward", "chosen_seed", "rejected_seed"):  # kept for the record
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            pair[key] = value
    if pair["chosen"] == pair["rejected"]:
        raise ValueError("chosen and rejected are identical")
    return pair


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """All valid pairs of a JSONL file; invalid lines are logged and skipped (an error if none is valid)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"preference pairs not found: {path} (see cadenza.training.dpo_pairs for the format)")
    pairs, bad = [], []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            pairs.append(check_pair(json.loads(line)))
        except ValueError as exc:
            bad.append(f"line {lineno}: {exc}")
    if bad:
        log.warning("%s: %d invalid pairs skipped (%s)", path, len(bad), "; ".join(bad[:5]))
    if not pairs:
        raise InputError(f"{path} holds no valid preference pair" + (f" ({bad[0]})" if bad else ""))
    return pairs


def make_pairs(candidates: Iterable[dict[str, Any]], min_gap: float = 0.0) -> list[dict[str, Any]]:
    """Scored candidates -> pairs. Each candidate: ``group`` (candidates of the same text share it), ``text_ids`` or
    ``text`` (or both), ``speech_tokens``, ``reward`` (higher is better), optional ``speaker`` and ``seed``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in candidates:
        groups.setdefault(str(c["group"]), []).append(c)
    pairs = []
    for group, cands in sorted(groups.items()):
        ranked = sorted(cands, key=lambda c: float(c["reward"]), reverse=True)
        best, worst = ranked[0], ranked[-1]
        if len(ranked) < 2 or float(best["reward"]) - float(worst["reward"]) < max(min_gap, 1e-12):
            continue
        pair = {"id": group, "speaker": best.get("speaker", ""), "chosen": list(best["speech_tokens"]),
                "rejected": list(worst["speech_tokens"]), "chosen_reward": float(best["reward"]),
                "rejected_reward": float(worst["reward"])}
        if "text_ids" in best:
            pair["text_ids"] = list(best["text_ids"])
        if best.get("text"):
            pair["text"] = best["text"]
        if "seed" in best:  # which draws they were (cadenza data dpo-pairs records its sampling seeds)
            pair.update(chosen_seed=best["seed"], rejected_seed=worst["seed"])
        pairs.append(pair)
    return pairs


def write_pairs(path: str | Path, pairs: Iterable[dict[str, Any]]) -> None:
    Path(path).write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
