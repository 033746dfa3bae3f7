"""What test modules import by name: the repository root and a tolerance check.

These live here, not in ``conftest.py``: with more than one ``conftest.py`` under ``tests/`` the name ``conftest``
means whichever was imported last, so ``from helpers import ...`` would depend on the order tests are collected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def fixture_dir(env: str, default: str) -> Path:
    """A parity fixture folder: ``$env`` if set, else ``default`` relative to the repository root (it may not
    exist: callers skip then). Test modules that build their parameters from a fixture call it at import time."""
    return Path(os.environ.get(env) or (REPO_ROOT / default)).resolve()


def vx2_fixture_dir() -> Path:
    """The VoxCPM 2 parity fixture folder (``CADENZA_FIXTURES_VOXCPM2``, default ``../shared/fixtures/voxcpm2``)."""
    return fixture_dir("CADENZA_FIXTURES_VOXCPM2", "../shared/fixtures/voxcpm2")


def assert_close(actual, expected, atol: float, name: str = "") -> None:
    """Assert ``max |actual - expected| <= atol`` (float64 difference) and equal shapes; ``name`` labels the failure."""
    a = actual.detach().cpu().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    diff = float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)))) if a.size else 0.0
    assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:g}"


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's intra-op threads set to one inside, restored after: the tests' models are tiny, and a second thread
    only adds synchronisation (elementwise ops up to 60x slower on shared, busy CI cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``cadenza *argv`` in this process -> ``(exit code, stdout, stderr)``; argparse's own refusals (SystemExit)
    count as exit codes, and no traceback may reach stderr."""
    from cadenza.cli.main import main as cli_main

    try:
        code = cli_main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err
