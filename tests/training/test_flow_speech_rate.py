"""Speaking-rate pairs for the flow (``speed_method="flow"``, docs/controls.md "Speed"): a corpus row's
``speech_rate`` reaches the shards, ``FlowItems`` cuts tokens and mel to lengths that keep the rate, and the
training forward resamples ``mu`` to the mel's frames exactly as the engine does at inference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
import torch.nn.functional as F

from cadenza.data.extractors import ManifestArraysExtractor, load_extractor
from cadenza.data.prepare import add_features, prepare
from cadenza.errors import InputError
from cadenza.models.cosyvoice2.flow import TokenToMelFlow
from cadenza.training.flow_objective import FlowForTraining
from cadenza.training.flow_stage import FlowItems
from cadenza.training.model_files import resolve_model
from helpers import one_torch_thread

from small_model import small_training_model

SR = 24000


@pytest.fixture(scope="module")
def tiny():
    return resolve_model(small_training_model()).config


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


class _Xvector:
    """A constant x-vector per utterance (FlowItems needs the field; its value does not matter here)."""

    name, fields = "xvec", ("spk_emb",)

    def __call__(self, utt):
        return {"spk_emb": torch.ones(192)}


@pytest.fixture(scope="module")
def rate_corpus(tmp_path_factory):
    """Three utterances of 1.0 s: tokens for 25, 50 and 13 frames of the speed-1 timeline (rates 1, 2 and 0.5)."""
    corpus = tmp_path_factory.mktemp("rate_corpus")
    rows, arrays = [], []
    for i, (tokens, rate) in enumerate(((25, None), (50, 2.0), (13, 0.5))):
        t = np.arange(SR) / SR
        sf.write(corpus / f"{i}.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), SR)
        rows.append({"audio": f"{i}.wav", "text": "a tone", "speaker": "s", "id": f"u{i}"})
        arrays.append({"id": f"u{i}", "speech_tokens": [1 + k % 40 for k in range(tokens)], "text_ids": [1, 2],
                       **({} if rate is None else {"speech_rate": rate})})
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (corpus / "arrays.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arrays))
    out = tmp_path_factory.mktemp("rate_data")
    prepare(corpus / "manifest.jsonl", "jsonl", out, f0=False)
    assert add_features(out, load_extractor(f"cadenza.data.extractors:manifest_arrays={corpus / 'arrays.jsonl'}"),
                        progress=False)["failed"] == 0
    assert add_features(out, _Xvector(), progress=False)["failed"] == 0
    return out


def test_manifest_arrays_keep_the_speech_rate_and_refuse_a_bad_one(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text('{"id": "x", "speech_tokens": [1, 2], "speech_rate": 1.5}\n')
    row = ManifestArraysExtractor(good).rows["x"]
    assert row["speech_rate"].dtype == np.float32 and row["speech_rate"].tolist() == [1.5]
    for bad in ("0", "-1", '"fast"', "true", "40"):
        good.write_text(f'{{"id": "x", "speech_tokens": [1, 2], "speech_rate": {bad}}}\n')
        with pytest.raises(InputError, match="a.jsonl:1: speech_rate"):
            ManifestArraysExtractor(good)


def test_flow_items_cut_tokens_and_mel_to_the_stored_rate(rate_corpus):
    items = FlowItems(rate_corpus, ratio=2, min_tokens=4, max_tokens=0)
    by_tokens = {}
    for i in range(len(items)):
        it = items[i]
        by_tokens[it["rate"]] = (it["tokens"].numel(), it["mel"].shape[0])
    frames = 50  # 1.0 s of 50 Hz mel
    assert by_tokens[1.0] == (25, 50)           # the frontend's rule: ratio frames per token
    assert by_tokens[2.0] == (50, frames)       # 2x: 100 speed-1 frames of tokens read in 50
    assert by_tokens[0.5] == (12, 48)           # 0.5x: floor(50 * 0.5 / 2) tokens, 2 * 12 / 0.5 frames


def test_rate_one_rows_train_exactly_as_before(tiny):
    torch.manual_seed(0)
    model = FlowForTraining(TokenToMelFlow(tiny.flow)).eval()
    b, n = 2, 9
    g = torch.Generator().manual_seed(1)
    args = (torch.randint(1, 50, (b, n), generator=g), torch.tensor([n, n]), torch.randn(b, 80, 2 * n, generator=g),
            torch.randn(b, 192, generator=g), torch.tensor([3, 0]), torch.tensor([0, 4]), torch.tensor([0, 8]),
            torch.rand(b, generator=g), torch.randn(b, 80, 2 * n, generator=g), torch.tensor([True, True]))
    with torch.no_grad():
        plain, count = model(*args)
        framed, count_f = model(*args, torch.tensor([2 * n, 2 * n]))
    torch.testing.assert_close(plain, framed)
    assert count == count_f


def test_mu_is_resampled_to_the_frames_of_a_faster_reading(tiny):
    model = FlowForTraining(TokenToMelFlow(tiny.flow))
    mu = torch.randn(2, 80, 20)
    out, mask = model._at_frame_lens(mu, torch.tensor([10, 6]), torch.tensor([10, 24]), 24)
    # 2x faster: each output frame is the mean of two input frames (linear, half-pixel centres)
    torch.testing.assert_close(out[0, :, :10], 0.5 * (mu[0, :, 0:20:2] + mu[0, :, 1:20:2]))
    assert out[0, :, 10:].abs().sum() == 0
    # 2x slower: the engine's rule, F.interpolate on the row's own 12 frames
    torch.testing.assert_close(out[1], F.interpolate(mu[1:2, :, :12], size=24, mode="linear")[0])
    assert mask[:, 0].sum(dim=1).tolist() == [10, 24]


def test_a_stage_step_on_a_mixed_batch_trains_every_row_at_its_rate(rate_corpus, tiny):
    """collate -> draws -> train_step with rows at rates 1, 2 and 0.5 in one batch: each row's noise and loss
    frames are its own mel's, and the step updates the flow."""
    from cadenza.training.flow_stage import FlowStage

    cfg = {"train": {"batch_size": 3, "max_steps": 2, "optim": {"lr": 1e-3, "warmup_steps": 0}},
           "model": small_training_model(), "flow": {"min_tokens": 4, "mask_ratio": [1.0, 1.0]}}
    stage = FlowStage(cfg, rate_corpus)
    stage.setup(torch.device("cpu"), lambda m: m)
    items = stage.dataset()
    batch = stage.collate([items[i] for i in range(len(items))])
    frames = batch["frame_lens"].tolist()
    assert sorted(frames) == [48, 50, 50] and batch["mel"].shape[2] == 50
    draws = stage.draws(batch, step=0)
    for i, f in enumerate(frames):  # noise only on each row's own frames
        assert draws["z"][i, :, :f].abs().sum() > 0 and draws["z"][i, :, f:].abs().sum() == 0
    before = {k: v.clone() for k, v in stage.flow.state_dict().items()}
    out = stage.train_step(batch, step=0)
    assert out["frames"] == sum(frames) and np.isfinite(out["loss"])  # mask ratio 1: every frame is a loss frame
    assert any(not torch.equal(before[k], v) for k, v in stage.flow.state_dict().items())


def test_items_outside_the_length_limits_are_said_not_silently_dropped(rate_corpus, caplog):
    """A voice's longer recordings were skipped with an INFO line only ``-v`` shows: now a warning with the count,
    the key and what to do."""
    with caplog.at_level("WARNING", logger="cadenza.training.flow_stage"):
        items = FlowItems(rate_corpus, ratio=2, min_tokens=4, max_tokens=20)
    assert len(items) < 3
    assert "longer than flow.max_tokens (20 speech tokens) and are skipped: raise flow.max_tokens" in caplog.text
    assert "of 3 items" in caplog.text
