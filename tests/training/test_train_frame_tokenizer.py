"""The frame-classifier speech tokenizer (cadenza-tiny v2): labels given per 25 Hz frame reach the shards through the
``manifest_arrays`` extractor, the ``frame_tokenizer`` stage learns to recover them from audio, and the exported
folder reloads as a speech tokenizer that emits the same ids."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import soundfile as sf
import torch

from cadenza.audio.whisper_mel import whisper_log_mel
from cadenza.data.extractors import ManifestArraysExtractor, load_extractor
from cadenza.data.prepare import add_features, prepare
from cadenza.errors import InputError
from cadenza.models.speech_tokenizer import load_speech_tokenizer
from cadenza.models.speech_tokenizer.config import SpeechTokenizerConfig
from cadenza.models.speech_tokenizer.model import SpeechTokenizerModel, SupervisedSpeechTokenizer
from cadenza.training.frame_tokenizer_stage import FrameTokenizerStage
from helpers import one_torch_thread

SR = 24000
FRAME = SR // 25  # one label per 40 ms
TONES = [0.0, 300.0, 520.0, 760.0, 1100.0, 1500.0]  # class 0: silence
MODEL = {"n_mels": 128, "hidden_size": 64, "num_heads": 2, "ffn_size": 128, "encoder1_layers": 2,
         "encoder2_layers": 0, "conv_strides": [2, 2], "conv_kernel": 3, "frame_classes": len(TONES)}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():  # tiny models (tests/helpers.py)
        yield


def _utterance(rng: random.Random) -> tuple[np.ndarray, list[int]]:
    """Tones (or silence) held 2-4 frames each: the audio and its per-frame class."""
    labels: list[int] = []
    parts = []
    for _ in range(rng.randint(6, 12)):
        k, n = rng.randrange(len(TONES)), rng.randint(2, 4)
        t = np.arange(n * FRAME) / SR
        parts.append(0.4 * np.sin(2 * math.pi * TONES[k] * t) if k else np.zeros(n * FRAME))
        labels += [k] * n
    return np.concatenate(parts).astype(np.float32), labels


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    torch.set_num_threads(1)
    corpus = tmp_path_factory.mktemp("frames_corpus")
    rng = random.Random(0)
    rows, arrays = [], []
    for i in range(48):
        wav, labels = _utterance(rng)
        sf.write(corpus / f"{i}.wav", wav, SR)
        rows.append({"audio": f"{i}.wav", "text": "tones", "speaker": "s", "id": f"u{i}"})
        arrays.append({"id": f"u{i}", "speech_tokens": labels, "text_ids": [1, 2, 3]})
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (corpus / "arrays.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arrays))
    out = tmp_path_factory.mktemp("frames_data")
    prepare(corpus / "manifest.jsonl", "jsonl", out, f0=False)
    extractor = load_extractor(f"cadenza.data.extractors:manifest_arrays={corpus / 'arrays.jsonl'}")
    summary = add_features(out, extractor, progress=False)
    assert summary["failed"] == 0
    return out


def test_manifest_arrays_extractor_rejects_bad_files(tmp_path):
    bad = tmp_path / "a.jsonl"
    bad.write_text('{"id": "x", "speech_tokens": "nope"}\n')
    with pytest.raises(InputError, match="a.jsonl:1"):
        ManifestArraysExtractor(bad)
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(InputError, match="non-empty"):
        ManifestArraysExtractor(bad)
    bad.write_text("")
    with pytest.raises(InputError, match="lists no utterances"):
        ManifestArraysExtractor(bad)


def test_frame_classifier_config_and_model():
    cfg = SpeechTokenizerConfig.from_dict(MODEL)
    assert cfg.codebook_size == len(TONES)
    model = SpeechTokenizerModel(cfg)
    assert model.quantizer is None and not any(k.startswith("quantizer") for k in model.state_dict())
    ids = model(torch.randn(2, 128, 40), torch.tensor([40, 20]))
    assert ids.shape == (2, 10) and (ids[1, 5:] == -1).all() and ((ids[0] >= 0) & (ids[0] < len(TONES))).all()
    with pytest.raises(InputError, match="frame_tokenizer stage"):
        SupervisedSpeechTokenizer(SpeechTokenizerConfig.from_dict({**MODEL, "vocab_size": 4}))
    with pytest.raises(InputError, match="no FSQ codes"):
        model.codes(torch.zeros(1, 64))


def test_stage_learns_the_labels_and_the_export_reloads(data_dir, tmp_path):
    config = {"train": {"batch_size": 8, "max_steps": 150, "optim": {"lr": 3e-3, "warmup_steps": 10}},
              "frame_tokenizer": {"model": MODEL, "heldout_fraction": 0.15}}
    stage = FrameTokenizerStage(config, data_dir)
    stage.setup(torch.device("cpu"), lambda m: m)
    before = stage.evaluate()["heldout_frame_acc"]
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(stage.dataset(), batch_size=8, shuffle=True, collate_fn=stage.collate,
                                         drop_last=True)
    step = 0
    while step < 150:
        for batch in loader:
            stage.train_step(batch, step)
            step += 1
            if step == 150:
                break
    after = stage.evaluate()["heldout_frame_acc"]
    assert after > 0.85 and after > before + 0.3, (before, after)

    stage.export(tmp_path)
    tokenizer = load_speech_tokenizer(tmp_path)
    item = stage.base[stage.heldout_idx[0]]
    from cadenza.audio.resample import resample

    wav16 = resample(item["wav"].float(), SR, 16000)
    ids = tokenizer(whisper_log_mel(wav16, n_mels=128))[0]
    labels = item["speech_tokens"].long()
    n = min(ids.numel(), labels.numel())
    assert float((ids[:n] == labels[:n]).float().mean()) > 0.8
    doc = json.loads((tmp_path / "speech_tokenizer.json").read_text())
    assert doc["metadata"]["heldout_frame_acc"] == pytest.approx(after)

    # A second round starts where the export left off (init_tokenizer), not from scratch.
    again = FrameTokenizerStage({**config, "frame_tokenizer": {**config["frame_tokenizer"],
                                                               "init_tokenizer": str(tmp_path)}}, data_dir)
    again.setup(torch.device("cpu"), lambda m: m)
    assert again.evaluate()["heldout_frame_acc"] == pytest.approx(after)
    other = {**MODEL, "hidden_size": 32}
    bad = FrameTokenizerStage({**config, "frame_tokenizer": {"model": other, "init_tokenizer": str(tmp_path)}},
                              data_dir)
    with pytest.raises(InputError, match="differs from frame_tokenizer.model in hidden_size"):
        bad.setup(torch.device("cpu"), lambda m: m)


def test_stage_rejects_a_config_without_classes(data_dir):
    with pytest.raises(InputError, match="frame_classes"):
        FrameTokenizerStage({"frame_tokenizer": {"model": {**MODEL, "frame_classes": 0}}}, data_dir)


def test_voice_augmentation_reaches_training_items_only(data_dir):
    """``frame_tokenizer.augment``: training items are heard in other voices (features change, labels keep their
    count per frame of the new features); held-out items stay as recorded."""
    config = {"frame_tokenizer": {"model": MODEL, "heldout_fraction": 0.15,
                                  "augment": {"probability": 1.0, "pitch": [1.5, 1.5], "tempo": [1.2, 1.2]}}}
    stage = FrameTokenizerStage(config, data_dir)
    plain = FrameTokenizerStage({"frame_tokenizer": {"model": MODEL, "heldout_fraction": 0.15}}, data_dir)
    augmented, recorded = stage.dataset()[0], plain.dataset()[0]
    assert augmented["labels"].numel() == augmented["mel"].shape[-1] // 4
    assert augmented["labels"].numel() == pytest.approx(recorded["labels"].numel() / 1.2, abs=2)
    held = stage._items(stage.heldout_idx)[0]
    assert torch.equal(held["mel"], plain._items(plain.heldout_idx)[0]["mel"])
    with pytest.raises(InputError, match="augment.pitch"):
        FrameTokenizerStage({"frame_tokenizer": {"model": MODEL, "augment": {"pitch": [3.0, 4.0]}}}, data_dir)


def test_voice_draws_depend_on_item_and_epoch_only(data_dir):
    """A resumed run (a fresh dataset object), another loader worker or another order draws the same voice for an
    item in an epoch as one uninterrupted run; the next epoch draws another."""
    config = {"train": {"seed": 3},
              "frame_tokenizer": {"model": MODEL, "augment": {"probability": 1.0, "pitch": [0.7, 1.4],
                                                              "tempo": [0.8, 1.25]}}}
    first = FrameTokenizerStage(config, data_dir).dataset()
    first.set_epoch(2)
    in_order = [first[i]["mel"] for i in range(3)]
    resumed = FrameTokenizerStage(config, data_dir).dataset()
    resumed.set_epoch(2)
    assert torch.equal(resumed[2]["mel"], in_order[2]) and torch.equal(resumed[0]["mel"], in_order[0])
    assert torch.equal(first[1]["mel"], in_order[1])  # asking again in the same epoch: the same voice
    resumed.set_epoch(3)
    assert not torch.equal(resumed[0]["mel"], in_order[0])
    other_seed = FrameTokenizerStage({**config, "train": {"seed": 4}}, data_dir).dataset()
    other_seed.set_epoch(2)
    assert not torch.equal(other_seed[0]["mel"], in_order[0])
