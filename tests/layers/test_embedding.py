"""``Embedding``: nn.Embedding's initialisation on real devices, none on meta (where a model is built to be loaded)."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

from cadenza.layers.embedding import Embedding


def test_initialises_as_nn_embedding_on_a_real_device():
    torch.manual_seed(0)
    ours = Embedding(7, 5)
    torch.manual_seed(0)
    theirs = nn.Embedding(7, 5)
    assert torch.equal(ours.weight, theirs.weight) and ours.weight.std() > 0.5
    assert list(ours.state_dict()) == ["weight"]


def test_loading_a_model_does_not_import_the_compiler():
    """Meta-device ``normal_`` runs torch's Python reference, whose first call imports ``torch._dynamo`` (~2 s); the
    built-in model must load without it (a fresh process: this one may have imported it for other tests)."""
    code = ("import sys, cadenza\n"
            "with cadenza.load() as tts:\n"
            "    assert tts.synthesize('Hi.', seed=0).samples.size > 0\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo'))[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
