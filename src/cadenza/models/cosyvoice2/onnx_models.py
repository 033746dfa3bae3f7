"""The two ONNX frontend models of the release, run with onnxruntime (the ``onnx`` extra).

* ``campplus.onnx``: CAM++ speaker encoder, mean-normalised Kaldi fbank ``[1, frames, 80]`` -> x-vector ``[192]``.
* ``speech_tokenizer_v2.onnx``: supervised FSQ speech tokenizer, whisper log-mel ``[1, 128, frames]`` at 16 kHz
  -> 25 Hz speech token ids in ``[0, 6561)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cadenza.errors import CheckpointError, MissingDependencyError


def _session(path: Path):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise MissingDependencyError(
            f"{path.name} needs onnxruntime: install the extra with `pip install 'cadenza[onnx]'`"
        ) from exc
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise CheckpointError(f"cannot load ONNX model {path}: {exc}") from exc


class CampPlusSpeakerEncoder:
    """x-vector of a 16 kHz utterance (mean-normalised 80-bin Kaldi fbank in, 192-d out)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sess = _session(self.path)
        self._input = self._sess.get_inputs()[0].name

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank ``[1, frames, 80]`` (already mean-normalised) -> embedding ``[1, 192]``."""
        feats = fbank.detach().cpu().float().reshape(1, -1, fbank.shape[-1]).numpy()
        out = self._sess.run(None, {self._input: feats})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(1, -1))


class OnnxSpeechTokenizer:
    """25 Hz speech token ids of a 16 kHz utterance (whisper 128-bin log-mel in)."""

    max_seconds = 30.0  # the released tokenizer was trained on <= 30 s windows; the reference asserts this

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sess = _session(self.path)
        self._inputs = [i.name for i in self._sess.get_inputs()]

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        """log_mel ``[1, 128, frames]`` -> ids ``[1, frames // 4]`` (int64)."""
        feats = log_mel.detach().cpu().float().numpy()
        lengths = np.array([feats.shape[2]], dtype=np.int32)
        out = self._sess.run(None, {self._inputs[0]: feats, self._inputs[1]: lengths})[0]
        return torch.from_numpy(np.asarray(out).reshape(1, -1).astype(np.int64))
