"""Retry on bad cases: the reference's non-streaming loop (``e2e_retry.safetensors``, README §7) and our streaming
variant (holdback while the verdict can still come before any audio is sent; otherwise stop at the verdict).

Texts, seeds, ratios and the per-attempt patch counts come from ``manifest.e2e_retry``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from cadenza.engine.voxcpm2 import VoxCPM2Engine
from cadenza.errors import InputError
from cadenza.models.voxcpm2.retry import RetryPolicy
from helpers import assert_close, vx2_fixture_dir

GEN_TOL = 2e-3  # README: whole generations
STREAM_TOL = 1e-5  # streamed vs one-shot decoding of the same latents


def _cases() -> list[str]:
    path = vx2_fixture_dir() / "manifest.json"
    return sorted(json.loads(path.read_text()).get("e2e_retry", {})) if path.is_file() else []


CASES = _cases()


@pytest.fixture(scope="module")
def engine(vx2_dir: Path) -> VoxCPM2Engine:
    return VoxCPM2Engine.from_pretrained(vx2_dir / "tiny_model")


@pytest.fixture(scope="module")
def retry_wavs(vx2_dir: Path) -> dict:
    return load_file(str(vx2_dir / "e2e_retry.safetensors"))


@pytest.fixture(scope="module")
def nonstreaming(engine, vx2_manifest) -> dict:
    """Each case synthesised once (reused by several tests)."""
    out = {}
    for name, case in vx2_manifest["e2e_retry"].items():
        req = engine.build(case["text_in"], seed=case["seed"], retry_ratio=case["ratio_threshold"])
        out[name] = (req, engine.synthesize(req))
    return out


@pytest.mark.parametrize("name", CASES)
def test_retry_matches_reference(nonstreaming, vx2_manifest, retry_wavs, name):
    case = vx2_manifest["e2e_retry"][name]
    req, wav = nonstreaming[name]
    assert req.text.text == case["text_after_core_cleanup"] and req.target_len == case["target_text_len"]
    attempts = req.outcome.attempts
    assert [a.seed for a in attempts] == case["seeds_used"]
    assert [a.n_patches for a in attempts] == [a["n_patches"] for a in case["attempts"]]
    policy = req.retry
    assert all(policy.loop_cap(req.target_len, req.options.max_len) == a["max_len"] for a in case["attempts"])
    assert [a.bad for a in attempts] == [a["n_patches"] >= case["target_text_len"] * case["ratio_threshold"]
                                         for a in case["attempts"]]
    assert req.seed_used == case["last_successful_seed"]
    assert wav.shape[0] == case["wav_samples"]
    assert_close(wav, retry_wavs[f"{name}_wav_out"], GEN_TOL, f"{name} waveform")


@pytest.mark.parametrize("name", CASES)
def test_streaming_retry_with_holdback_equals_nonstreaming(engine, nonstreaming, vx2_manifest, name):
    """Holdback covering the verdict: the same attempts are retried and the chosen one is streamed."""
    case = vx2_manifest["e2e_retry"][name]
    policy = RetryPolicy(ratio=case["ratio_threshold"])
    holdback = policy.bad_at(case["target_text_len"])
    req = engine.build(case["text_in"], seed=case["seed"], retry_ratio=case["ratio_threshold"],
                       stream_holdback=holdback)
    chunks = list(engine.stream(req))
    ref_req, wav = nonstreaming[name]
    assert req.seed_used == ref_req.seed_used and not req.outcome.truncated
    assert [a.seed for a in req.outcome.attempts] == [a.seed for a in ref_req.outcome.attempts]
    # bad attempts are abandoned at the verdict, not run to the cap
    for a in req.outcome.attempts[:-1]:
        assert a.bad and a.n_patches == holdback
    assert len(chunks) == ref_req.outcome.attempts[-1].n_patches
    assert_close(np.concatenate(chunks), wav, STREAM_TOL, f"{name}: streamed retry vs non-streaming retry")


def test_streaming_without_holdback_stops_at_verdict(engine, vx2_manifest):
    name = next((n for n in CASES if vx2_manifest["e2e_retry"][n]["attempts"][0]["n_patches"] >= math.ceil(
        vx2_manifest["e2e_retry"][n]["target_text_len"] * vx2_manifest["e2e_retry"][n]["ratio_threshold"])), None)
    assert name is not None, "the VoxCPM 2 fixture has no retry case whose first attempt is bad"
    case = vx2_manifest["e2e_retry"][name]
    req = engine.build(case["text_in"], seed=case["seed"], retry_ratio=case["ratio_threshold"], stream_holdback=0)
    chunks = list(engine.stream(req))
    bad_at = req.retry.bad_at(req.target_len)
    assert req.outcome.truncated and len(req.outcome.attempts) == 1 and req.outcome.attempts[0].bad
    assert len(chunks) == bad_at - 1  # the patch that settled the verdict is not sent
    assert req.seed_used == case["seed"]


def test_retry_disabled_runs_one_attempt_to_the_cap(engine, vx2_manifest):
    assert CASES, "the VoxCPM 2 fixture has no retry cases"
    name = CASES[0]
    case = vx2_manifest["e2e_retry"][name]
    req = engine.build(case["text_in"], seed=case["seed"], retry=False, retry_ratio=case["ratio_threshold"])
    engine.synthesize(req)
    assert len(req.outcome.attempts) == 1
    assert req.outcome.attempts[0].n_patches == case["attempts"][0]["n_patches"]
    streamed = engine.build(case["text_in"], seed=case["seed"], retry=False, retry_ratio=case["ratio_threshold"])
    assert len(list(engine.stream(streamed))) == case["attempts"][0]["n_patches"]  # no truncation without retry


def test_policy_rules():
    p = RetryPolicy(ratio=2.0)
    assert p.loop_cap(11, 4096) == 32 and p.loop_cap(11, 20) == 20  # int(n·ratio + 10), capped
    assert p.is_bad(22, 11) and not p.is_bad(21, 11) and p.bad_at(11) == 22
    q = RetryPolicy(ratio=1.5)
    assert q.bad_at(11) == 17 and q.is_bad(17, 11) and not q.is_bad(16, 11)
    assert RetryPolicy(enabled=False).attempts == 1 and RetryPolicy().attempts == 3
    for bad in ({"max_attempts": 0}, {"ratio": 0.0}, {"ratio": float("nan")}, {"max_holdback_patches": -1}):
        with pytest.raises(InputError):
            RetryPolicy(**bad)
