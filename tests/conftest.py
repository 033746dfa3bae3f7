"""Shared test fixtures: where the parity fixture folders live.

Parity tests read ``CADENZA_FIXTURES_COSYVOICE2`` (default ``../shared/fixtures/cosyvoice2`` relative to the
repository root) and ``CADENZA_FIXTURES_VOXCPM2`` (default ``../shared/fixtures/voxcpm2``) and skip with a clear
message only when that folder is absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

from helpers import fixture_dir, vx2_fixture_dir

# CI runs the property tests on a fixed sequence of examples, so a commit's result does not depend on the draw; runs
# elsewhere draw afresh each time and are where new counterexamples turn up (each one found becomes an @example).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (pyproject's addopts): one worker per usable core, at most one per 6 GiB of memory (each loads its
    own models) and at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 6.0 * cores
    return max(1, min(cores, int(memory_gib // 6), 8))


def pytest_configure(config) -> None:
    # Under pytest-xdist (``-n N``) each worker process gets its share of the cores for torch's intra-op threads:
    # N workers x all cores each would oversubscribe the machine and slow every test down.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(scope="session")
def cv2_dir() -> Path:
    path = fixture_dir("CADENZA_FIXTURES_COSYVOICE2", "../shared/fixtures/cosyvoice2")
    if not (path / "config.yaml").is_file():
        pytest.skip(f"CosyVoice 2 parity fixtures not found at {path} (set CADENZA_FIXTURES_COSYVOICE2)")
    return path


@pytest.fixture(scope="session")
def vx2_dir() -> Path:
    """The VoxCPM 2 parity fixture folder; skips when it has no ``manifest.json``."""
    path = vx2_fixture_dir()
    if not (path / "manifest.json").is_file():
        pytest.skip(f"VoxCPM 2 parity fixtures not found at {path} (set CADENZA_FIXTURES_VOXCPM2)")
    return path


@pytest.fixture(scope="session")
def vx2_manifest(vx2_dir: Path) -> dict:
    """The VoxCPM 2 fixture's ``manifest.json`` (shared by every module: read it, never change it)."""
    return json.loads((vx2_dir / "manifest.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def vx2_model_dir() -> Path:
    """The fixture's ``tiny_model/``; skips when it has no ``config.json`` (the manifest is not needed)."""
    path = vx2_fixture_dir() / "tiny_model"
    if not (path / "config.json").is_file():
        pytest.skip(f"VoxCPM 2 fixtures not found at {path.parent} (set CADENZA_FIXTURES_VOXCPM2)")
    return path


@pytest.fixture(scope="module")
def vx2_model(vx2_dir: Path):
    """The fixture's tiny model in float32 on the CPU, loaded once per test module (some tests switch modes or hook
    it for a while: no module sees another's)."""
    from cadenza.models.voxcpm2.loader import load_model

    return load_model(vx2_dir / "tiny_model", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def cv2_manifest(cv2_dir: Path) -> dict:
    return json.loads((cv2_dir / "manifest.json").read_text())


@pytest.fixture(scope="session")
def cv2_npz(cv2_dir: Path):
    """``cv2_npz('flow_cases')`` -> dict of numpy arrays."""
    cache: dict[str, dict[str, np.ndarray]] = {}

    def load(name: str) -> dict[str, np.ndarray]:
        if name not in cache:
            with np.load(cv2_dir / f"{name}.npz") as z:
                cache[name] = {k: z[k] for k in z.files}
        return cache[name]

    return load


@pytest.fixture(scope="session")
def builtin_tts():
    """The built-in model (cadenza-tiny), loaded once for the tests that need real speech: its flow prompt is primed
    once too (the first stream of a voice pays for it)."""
    import cadenza

    model = cadenza.load()
    yield model
    model.close()


@pytest.fixture(autouse=True, scope="session")
def _machine_pinned_busy():
    """The VoxCPM 2 engine runs a lone request on every core only while the machine is otherwise idle
    (``MachineLoad``): the suite pins the machine as busy, so a result does not depend on what else runs beside the
    tests (tests that need the widening give their engine an idle machine: tests/engine/test_lone_request.py,
    test_vx2_scheduler.py)."""
    from cadenza.engine.machine_load import MachineLoad

    real = MachineLoad.idle
    MachineLoad.idle = lambda self, threshold=0.3: False
    yield
    MachineLoad.idle = real


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    yield
