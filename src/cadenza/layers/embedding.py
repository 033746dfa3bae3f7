"""``Embedding``: ``nn.Embedding`` that skips its random initialisation when built on the meta device.

The loaders build every model on the meta device and assign the checkpoint's tensors (no initialisation, no second
copy). ``nn.Embedding`` initialises with ``normal_``, which has no native meta kernel: on meta it runs torch's Python
reference, whose first call imports ``torch._dynamo`` — about 2 s of every model load (the CLI, the server's start,
each test process) spent on a module nothing else uses. A meta tensor holds no values, so there is nothing to
initialise; on a real device (training from scratch) it initialises exactly as ``nn.Embedding`` does.
"""

from __future__ import annotations

from torch import nn


class Embedding(nn.Embedding):
    """``nn.Embedding(num_embeddings, embedding_dim)`` (same parameters and state-dict keys): ``weight [N, D]``."""

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        super().reset_parameters()
