"""``prepare``: corpus -> validated, feature-extracted shards (see ``shards.py`` for the layout).

Items are split, in id order, into shards of ``shard_size``; each shard is processed whole and marked finished, so
a re-run skips finished shards (resume) and ``part``/``num_parts`` lets several processes share a corpus (shard k
belongs to part ``k % num_parts``; whichever part finishes last writes the index). Every item is validated
(``validate.py``) and run through the extractors; a failing item is recorded in ``rejected.jsonl`` with a reason
and a category and skipped. ``add_features`` runs more extractors over an already prepared corpus (e.g. a speech
tokenizer trained after the data was prepared) and stores their output in sidecar shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from cadenza.data.corpus import CorpusItem, read_corpus
from cadenza.data.extractors import (
    PCM_SCALE,
    Extractor,
    Utterance,
    default_extractors,
    model_dir_extractors,
)
from cadenza.data.shards import (
    INDEX_FILE,
    REJECTED_FILE,
    SUMMARY_FILE,
    ShardWriter,
    atomic_write_text,
    read_done,
    read_jsonl,
    write_jsonl,
)
from cadenza.data.validate import (
    DataLimits,
    ItemRejected,
    check_speaking_rate,
    check_text,
    check_token_ratio,
    load_checked_audio,
)
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.config import MelConfig

log = logging.getLogger(__name__)
FINGERPRINT_FILE = "corpus.json"


def _fingerprint(items: Sequence[CorpusItem], shard_size: int, corpus: str | Path | None) -> str:
    """What a resume (or another part) must find the same: the items, their audio as paths inside the corpus (so the
    same corpus named from another folder, by an absolute path or with a trailing slash is the same corpus).
    ``corpus`` None: the audio paths as read (how folders prepared before 2026-12-08 were fingerprinted)."""
    root = None
    if corpus is not None:
        path = Path(corpus).absolute()
        root = path if path.is_dir() else path.parent
    h = hashlib.sha256(f"shard_size={shard_size}\n".encode())
    for it in items:
        audio = it.audio if root is None else os.path.relpath(Path(it.audio).absolute(), root)
        h.update(f"{it.id}\t{audio}\t{it.text}\t{it.speaker}\t{it.language}\n".encode())
    return h.hexdigest()


def _check_fields(extractors: Sequence[Extractor]) -> list[str]:
    seen: dict[str, str] = {}
    for ex in extractors:
        if getattr(ex, "needs", ()):
            raise InputError(f"extractor {ex.name!r} reads stored fields ({', '.join(ex.needs)}): run it with "
                             "`cadenza data extract` on the prepared corpus, after they are stored")
        for f in ex.fields:
            if f in seen:
                raise InputError(f"extractors {seen[f]!r} and {ex.name!r} both produce the field {f!r}")
            seen[f] = ex.name
    return sorted(seen)


def _run_extractors(utt: Utterance, extractors: Sequence[Extractor]) -> dict[str, Any]:
    arrays: dict[str, Any] = {}
    for ex in extractors:
        try:
            out = ex(utt)
        except ItemRejected:
            raise
        except Exception as exc:  # any extractor failure rejects this item only
            log.debug("extractor %s failed on %s", ex.name, utt.id, exc_info=True)
            raise ItemRejected(f"extractor {ex.name} failed: {type(exc).__name__}: {exc}", "extractor") from exc
        unexpected = set(out) - set(ex.fields)
        if unexpected:
            raise ItemRejected(f"extractor {ex.name} returned undeclared fields {sorted(unexpected)}", "extractor")
        arrays.update(out)
    return arrays


def _process(item: CorpusItem, extractors: Sequence[Extractor], limits: DataLimits) -> tuple[dict[str, Any], dict]:
    text = check_text(item.text)
    wav = load_checked_audio(item.audio, limits)
    seconds = wav.numel() / limits.sample_rate
    check_speaking_rate(text, seconds, limits)
    utt = Utterance(item.id, text, wav, limits.sample_rate, item.speaker, item.language)
    arrays = _run_extractors(utt, extractors)
    if "speech_tokens" in arrays and "text_ids" in arrays:
        check_token_ratio(len(arrays["speech_tokens"]), len(arrays["text_ids"]), limits)
    entry = {"id": item.id, "text": text, "speaker": item.speaker, "language": item.language,
             "audio": str(item.audio), "seconds": round(seconds, 4)}
    return arrays, entry


def _model_config(model_dir: str | Path):
    """The ``CosyVoice2Config`` of a model folder, or None when it has no readable config (the flow must see the mel
    features it was trained on, and the LM's decoding limits bound the items it can learn from)."""
    from cadenza.builtin import local_model_path
    from cadenza.errors import CheckpointError
    from cadenza.models.cosyvoice2.config import CosyVoice2Config
    from cadenza.models.cosyvoice2.loader import CONFIG_NAMES, QWEN_DIR

    d = local_model_path(model_dir)  # "cadenza-tiny": the built-in folder
    yaml_path = next((d / n for n in CONFIG_NAMES if (d / n).is_file()), None)
    if yaml_path is None or not (d / QWEN_DIR / "config.json").is_file():
        return None
    try:
        return CosyVoice2Config.from_files(yaml_path, d / QWEN_DIR / "config.json")
    except CheckpointError:
        log.warning("cannot read %s; using the CosyVoice 2 mel settings and length limits", yaml_path)
        return None


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, unit="utt", desc=desc, dynamic_ncols=True)


def _shard(items: Sequence[CorpusItem], k: int, size: int) -> Sequence[CorpusItem]:
    return items[k * size : (k + 1) * size]


def _finalize(out: Path, n_shards: int, corpus_rejected: list[dict], summary: dict) -> dict | None:
    """Write index.jsonl / rejected.jsonl / prepare.json once every shard is finished; None if some are not."""
    records = [read_done(out, k) for k in range(n_shards)]
    if any(r is None for r in records):
        return None
    entries = [e for r in records for e in r["entries"]]
    rejected = corpus_rejected + [x for r in records for x in r["rejected"]]
    write_jsonl(out / INDEX_FILE, entries)
    write_jsonl(out / REJECTED_FILE, rejected)
    summary = {**summary, "accepted": len(entries), "rejected": len(rejected),
               "rejected_by_category": dict(sorted(Counter(r["category"] for r in rejected).items())),
               "seconds": round(sum(e["seconds"] for e in entries), 2)}
    atomic_write_text(out / SUMMARY_FILE, json.dumps(summary, indent=2, ensure_ascii=False))
    return summary


def prepare(
    corpus: str | Path,
    layout: str,
    out: str | Path,
    model_dir: str | Path | None = None,
    extractors: Sequence[Extractor] = (),
    shard_size: int = 256,
    limits: DataLimits | None = None,
    mel: MelConfig | None = None,
    wav: bool = True,
    f0: bool = True,
    part: int = 0,
    num_parts: int = 1,
    progress: bool = True,
) -> dict:
    """Prepare ``corpus`` (``layout``: ljspeech | libritts | jsonl) into ``out``; resumable.

    Features: mel (+ 24 kHz wav, + f0) always; speech tokens / x-vectors / text ids from ``model_dir``'s frontend
    files when given; plus any ``extractors``. With ``model_dir``, limits whose token/text ratios are the defaults
    take the model's own (its LM's ``min_token_text_ratio`` ... ``max_token_text_ratio``). Returns the summary (also in ``out/prepare.json`` once all parts are
    done) with this run's ``processed_shards`` / ``skipped_shards``.
    """
    if shard_size < 1 or not 0 <= part < num_parts:
        raise InputError("need shard_size >= 1 and 0 <= part < num_parts")
    limits = limits or DataLimits()
    model_cfg = _model_config(model_dir) if model_dir else None
    mel = mel or (model_cfg.mel if model_cfg is not None else MelConfig())
    default = DataLimits()
    if model_cfg is not None and (limits.min_token_text_ratio, limits.max_token_text_ratio) == (
            default.min_token_text_ratio, default.max_token_text_ratio):
        # Unless the caller set them: the model's own decoding limits (cadenza-tiny's phoneme LM: 0.5-4 per id).
        limits = replace(limits, min_token_text_ratio=model_cfg.lm.min_token_text_ratio,
                         max_token_text_ratio=model_cfg.lm.max_token_text_ratio)
    if mel.sampling_rate != limits.sample_rate:
        raise InputError(f"mel sampling rate {mel.sampling_rate} != data sample rate {limits.sample_rate}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    items, corpus_rejected = read_corpus(corpus, layout)
    all_extractors = [*default_extractors(mel, wav, f0),
                      *(model_dir_extractors(model_dir) if model_dir else []), *extractors]
    fields = _check_fields(all_extractors)
    fingerprint = _fingerprint(items, shard_size, corpus)
    # Limits and mel settings decide which items a shard holds and what is in it: a resume must use the same.
    settings = json.loads(json.dumps({"limits": asdict(limits), "mel": asdict(mel)}))  # as stored: lists, not tuples
    fp_path = out / FINGERPRINT_FILE
    if fp_path.is_file():
        try:
            old = json.loads(fp_path.read_text(encoding="utf-8"))
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            raise InputError(f"{fp_path} is unreadable ({exc}): {out} is not a folder this command wrote; "
                             "use a new --out folder (or delete it)") from exc
        if (old.get("fingerprint") not in (fingerprint, _fingerprint(items, shard_size, None))
                or old.get("fields") != fields
                or old.get("settings", settings) != settings):
            raise InputError(f"{out} was prepared from a different corpus, shard size, feature set or limits; "
                             "use a new --out folder (or delete it)")
    else:
        try:
            atomic_write_text(fp_path, json.dumps({"fingerprint": fingerprint, "fields": fields,
                                                   "settings": settings}))
        except OSError as exc:
            raise InputError(f"cannot write to the output folder {out}: {exc.strerror or exc}") from exc
    n_shards = (len(items) + shard_size - 1) // shard_size
    mine = [k for k in range(n_shards) if k % num_parts == part]
    todo = [k for k in mine if read_done(out, k) is None]
    bar = _progress(sum(len(_shard(items, k, shard_size)) for k in todo), progress, f"prepare {Path(corpus).name}")
    try:
        for k in todo:
            writer = ShardWriter(out, k)
            for i, item in enumerate(_shard(items, k, shard_size)):
                try:
                    arrays, entry = _process(item, all_extractors, limits)
                    try:
                        writer.add(f"{i:05d}", arrays, entry)
                    except ValueError as exc:
                        raise ItemRejected(f"an extractor returned {exc}", "extractor") from exc
                except ItemRejected as exc:
                    writer.reject({"id": item.id, "audio": str(item.audio), "category": exc.category, "reason": str(exc)})
                bar.update(1)
            writer.finish()
    finally:
        bar.close()
    summary = {"corpus": str(corpus), "layout": layout, "items": len(items) + len(corpus_rejected),
               "shards": n_shards, "shard_size": shard_size, "fields": fields,
               "extractors": [ex.name for ex in all_extractors], "limits": asdict(limits), "mel": asdict(mel)}
    final = _finalize(out, n_shards, [r.to_json() for r in corpus_rejected], summary)
    result = final or summary
    return {**result, "processed_shards": len(todo), "skipped_shards": len(mine) - len(todo), "complete": final is not None}


def _stored_utterance(entry: dict, arrays: dict[str, torch.Tensor], sample_rate: int) -> Utterance:
    if "wav" not in arrays:
        raise InputError("add_features needs the stored 24 kHz waveform (prepare without --no-wav)")
    wav = arrays["wav"].float() / PCM_SCALE
    return Utterance(entry["id"], entry["text"], wav, sample_rate, entry.get("speaker", ""), entry.get("language", ""))


class _StoredFields:
    """The fields an extractor ``needs`` (``Extractor`` docs), read from the corpus's shards by utterance id."""

    def __init__(self, data_dir: Path, extractor: Extractor) -> None:
        from cadenza.data.dataset import ShardDataset

        self.needs = tuple(extractor.needs)
        try:
            self.dataset = ShardDataset(data_dir, fields=self.needs)  # only items that have every one of them
        except InputError as exc:
            raise InputError(f"extractor {extractor.name!r} needs the stored fields {', '.join(self.needs)}, and "
                             f"{data_dir} has no item with them: extract those first ({exc})") from exc
        self.by_id = {e["id"]: i for i, e in enumerate(self.dataset.entries)}

    def fields_of(self, utt_id: str) -> dict[str, torch.Tensor]:
        i = self.by_id.get(utt_id)
        if i is None:
            raise ItemRejected(f"lacks a stored field the extractor needs ({', '.join(self.needs)})", "extractor")
        return {f: self.dataset.field(i, f) for f in self.needs}


def _stored_fields(data_dir: Path, extractor: Extractor) -> _StoredFields | None:
    return _StoredFields(data_dir, extractor) if getattr(extractor, "needs", ()) else None


def add_features(data_dir: str | Path, extractor: Extractor, sample_rate: int = 24000, progress: bool = True) -> dict:
    """Run ``extractor`` over a prepared corpus (from the stored waveforms) into sidecar shards; resumable.

    Items it fails on keep their other features and just lack the new fields (listed with reasons in
    ``rejected.<name>.jsonl``); datasets that need those fields skip them. An extractor that declares ``needs``
    gets those stored fields as ``utt.stored``.
    """
    from safetensors import SafetensorError, safe_open

    from cadenza.data.shards import tensor_file

    data_dir = Path(data_dir)
    if not (data_dir / INDEX_FILE).is_file():
        raise InputError(f"{data_dir} is not a prepared corpus (no {INDEX_FILE}); run `cadenza data prepare` first")
    entries = read_jsonl(data_dir / INDEX_FILE)
    by_shard: dict[int, list[dict]] = {}
    for n, e in enumerate(entries, 1):
        if not (isinstance(e.get("shard"), int) and e["shard"] >= 0 and isinstance(e.get("key"), str)
                and isinstance(e.get("id"), str) and isinstance(e.get("text"), str)
                and isinstance(e.get("fields"), list)):
            raise InputError(f"{data_dir / INDEX_FILE}:{n} lacks shard/key/id/text/fields: the folder is damaged")
        by_shard.setdefault(e["shard"], []).append(e)
    todo = [k for k in sorted(by_shard) if read_done(data_dir, k, extractor.name) is None]
    stored = _stored_fields(data_dir, extractor) if todo else None
    bar = _progress(sum(len(by_shard[k]) for k in todo), progress, f"extract {extractor.name}")
    try:
        for k in todo:
            writer = ShardWriter(data_dir, k, extractor.name)
            shard = tensor_file(data_dir, k)
            try:
                f = safe_open(str(shard), framework="pt")
            except (OSError, SafetensorError) as exc:
                raise InputError(f"cannot read shard {shard} ({exc}): the folder is damaged; prepare it again") from exc
            with f:
                for e in by_shard[k]:
                    try:
                        arrays = {"wav": f.get_tensor(f"{e['key']}/wav")} if "wav" in e["fields"] else {}
                    except (SafetensorError, KeyError, OSError) as exc:
                        raise InputError(f"shard {shard} lacks {e['key']}/wav ({exc}): the folder is damaged; "
                                         "prepare it again") from exc
                    try:
                        utt = _stored_utterance(e, arrays, sample_rate)
                        if stored is not None:
                            utt.stored = stored.fields_of(e["id"])
                        out = _run_extractors(utt, [extractor])
                        try:
                            writer.add(e["key"], out)
                        except ValueError as exc:
                            raise ItemRejected(f"extractor {extractor.name} returned {exc}", "extractor") from exc
                    except ItemRejected as exc:
                        writer.reject({"id": e["id"], "category": exc.category, "reason": str(exc)})
                    bar.update(1)
            writer.finish({"fields": list(extractor.fields)})
    finally:
        bar.close()
    rejected = [x for k in sorted(by_shard) if (r := read_done(data_dir, k, extractor.name)) for x in r["rejected"]]
    write_jsonl(data_dir / f"rejected.{extractor.name}.jsonl", rejected)
    return {"extractor": extractor.name, "items": len(entries), "failed": len(rejected), "processed_shards": len(todo)}
