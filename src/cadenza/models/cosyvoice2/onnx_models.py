"""The two ONNX frontend models of the release, run with onnxruntime (the ``onnx`` extra).

* ``campplus.onnx``: CAM++ speaker encoder, mean-normalised Kaldi fbank ``[1, frames, 80]`` -> x-vector ``[192]``.
* ``speech_tokenizer_v2.onnx``: supervised FSQ speech tokenizer, whisper log-mel ``[1, 128, frames]`` at 16 kHz
  -> 25 Hz speech token ids in ``[0, 6561)``.

Both are created eagerly: the session parses the whole file, and the input signature is checked against what the
frontend feeds (the same ranks and dtypes the reference feeds), so a truncated or wrong file is a ``CheckpointError`` at load. A failure of onnxruntime
while running is a ``CheckpointError`` too (never an input error: the frontend has already checked the audio).
Messages name the file, not its absolute path (they can reach a client).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cadenza.errors import CheckpointError, MissingDependencyError

FBANK_BINS = 80
WHISPER_MELS = 128


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
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise CheckpointError(f"cannot load ONNX model {path}: {exc}") from exc


def _dims_fit(shape, expected: tuple[int | None, ...]) -> bool:
    """A declared ONNX shape (ints, or names / None for dynamic axes) fits ``expected`` (None: any size)."""
    if shape is None or len(shape) != len(expected):
        return False
    return all(not isinstance(d, int) or e is None or d == e for d, e in zip(shape, expected))


def _run(path: Path, sess, feeds: dict) -> np.ndarray:
    try:
        return sess.run(None, feeds)[0]
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors are plain Exceptions; the model is at fault
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in feeds.items())
        raise CheckpointError(f"{path.name} failed at run time on {shapes}: {exc}") from exc


class CampPlusSpeakerEncoder:
    """x-vector of a 16 kHz utterance (mean-normalised 80-bin Kaldi fbank in, 192-d out)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sess = _session(self.path)
        inputs, outputs = self._sess.get_inputs(), self._sess.get_outputs()
        if (len(inputs) != 1 or not outputs or inputs[0].type != "tensor(float)"
                or not _dims_fit(inputs[0].shape, (None, None, FBANK_BINS))):
            got = ", ".join(f"{i.name} {i.type} {i.shape}" for i in inputs)
            raise CheckpointError(f"{self.path}: not a speaker encoder: it must take one float fbank input "
                                  f"[1, frames, {FBANK_BINS}], it takes {got or 'nothing'}")
        self._input = inputs[0].name

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank ``[1, frames, 80]`` (already mean-normalised) -> embedding ``[1, 192]``."""
        feats = fbank.detach().cpu().float().reshape(1, -1, fbank.shape[-1]).numpy()
        out = _run(self.path, self._sess, {self._input: feats})
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(1, -1))


class OnnxSpeechTokenizer:
    """25 Hz speech token ids of a 16 kHz utterance (whisper 128-bin log-mel in)."""

    max_seconds = 30.0  # the released tokenizer was trained on <= 30 s windows; the reference asserts this

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sess = _session(self.path)
        inputs, outputs = self._sess.get_inputs(), self._sess.get_outputs()
        ok = (len(inputs) == 2 and len(outputs) >= 1 and inputs[0].type == "tensor(float)"
              and _dims_fit(inputs[0].shape, (None, WHISPER_MELS, None)) and inputs[1].type == "tensor(int32)"
              and _dims_fit(inputs[1].shape, (None,)) and outputs[0].type.startswith(("tensor(int", "tensor(uint")))
        if not ok:
            got = ", ".join(f"{i.name} {i.type} {i.shape}" for i in inputs)
            raise CheckpointError(f"{self.path}: not a speech tokenizer: it must take a float log-mel "
                                  f"[1, {WHISPER_MELS}, frames] and int32 lengths [1] and give integer ids; it takes "
                                  f"{got or 'nothing'}")
        self._inputs = [i.name for i in inputs]

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        """log_mel ``[1, 128, frames]`` -> ids ``[1, frames // 4]`` (int64)."""
        feats = log_mel.detach().cpu().float().numpy()
        lengths = np.array([feats.shape[2]], dtype=np.int32)
        out = _run(self.path, self._sess, {self._inputs[0]: feats, self._inputs[1]: lengths})
        return torch.from_numpy(np.asarray(out).reshape(1, -1).astype(np.int64))
