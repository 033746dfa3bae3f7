"""The LM stage's items: text ids + speech tokens (+ speaker) from a prepared corpus.

Text ids come from the corpus (``text_ids``, written by ``cadenza data prepare --model``) or, when absent, from
tokenising the transcript with the configured tokenizer; items that have neither are skipped. Items longer than
the configured limits are skipped (lengths are read from the shard headers, no data is loaded).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from cadenza.data.dataset import ShardDataset
from cadenza.errors import InputError

log = logging.getLogger(__name__)


class LMItems(Dataset):
    """``[i] -> {"index": i, "text_ids": [...], "speech_tokens": [...], "speaker": str, "id": str}``."""

    def __init__(self, data_dir: str | Path, tokenizer=None, max_speech_tokens: int = 0, max_text_tokens: int = 0) -> None:
        self.base = ShardDataset(data_dir, ("speech_tokens",), optional=("text_ids",))
        self.tokenizer = tokenizer
        keep, no_text, too_long = [], 0, 0
        for i in range(len(self.base)):
            shapes = self.base.shapes(i)
            if "text_ids" not in shapes and tokenizer is None:
                no_text += 1
                continue
            n_speech = shapes["speech_tokens"][0]
            n_text = shapes["text_ids"][0] if "text_ids" in shapes else 0
            if n_speech == 0 or (max_speech_tokens and n_speech > max_speech_tokens) or (
                    max_text_tokens and n_text > max_text_tokens):
                too_long += 1
                continue
            keep.append(i)
        if no_text:
            log.warning("%d items have no text_ids and no tokenizer is configured: skipped", no_text)
        if too_long:
            log.warning("%d items are empty or exceed the lm length limits (lm.max_text_tokens / "
                        "lm.max_speech_tokens): skipped", too_long)
        if not keep:
            raise InputError(f"no usable LM items in {data_dir}: need speech_tokens and text_ids (or model.tokenizer)")
        self.keep = keep

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.base[self.keep[i]]
        if "text_ids" in item:
            text_ids = item["text_ids"].tolist()
        else:
            text_ids = self.tokenizer.encode(item["text"])
        return {"index": i, "id": item["id"], "speaker": item["speaker"], "text_ids": text_ids,
                "speech_tokens": item["speech_tokens"].tolist()}
