"""Build a complete CosyVoice 2 model folder for end-to-end tests from the reduced parity checkpoint.

The fixture folder has the weights and config but no tokenizer files and no ONNX frontend models. We add, in a
temporary folder (the fixture files are linked, never copied into the repo):
* ``CosyVoice-BlankEN/vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``: a byte-level BPE trained here, small
  enough that every id (with the 20 special tokens) indexes the reduced Qwen vocabulary;
* ``campplus.onnx``: time-mean of the fbank times a fixed matrix -> 192-d (same I/O signature as CAM++);
* ``speech_tokenizer_v2.onnx``: 4-frame average pool of the log-mel, argmax over mel bins -> ids (same I/O as S3 v2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from cadenza.models.cosyvoice2.config import CosyVoice2Config

CORPUS = [
    "Hello there, this is a small test of the speech synthesizer.",
    "Just by listening a few minutes a day, you will be able to eliminate negative thoughts.",
    "希望你以后能够做的比我还好呦。", "今天天气很好，我们去公园散步吧。",
] * 20


def _tokenizer_files(directory: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.model.save(str(directory))
    n = tok.get_vocab_size()
    added = {str(n + i): {"content": c, "special": True}
             for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))


def _onnx_models(directory: Path, embed_dim: int, speech_vocab: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    proj = numpy_helper.from_array((rng.standard_normal((80, embed_dim)) * 0.1).astype(np.float32), "proj")
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
         helper.make_node("MatMul", ["pooled", "proj"], ["embedding"])],
        "campplus_toy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, None, 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, embed_dim])],
        [proj],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), directory / "campplus.onnx")
    vocab = numpy_helper.from_array(np.array(speech_vocab, dtype=np.int64), "vocab")
    graph = helper.make_graph(
        [helper.make_node("AveragePool", ["feats"], ["pooled"], kernel_shape=[4], strides=[4]),
         helper.make_node("ArgMax", ["pooled"], ["bins"], axis=1, keepdims=0),
         helper.make_node("Mod", ["bins", "vocab"], ["ids"])],
        "speech_tokenizer_toy",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, None]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])],
        [vocab],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              directory / "speech_tokenizer_v2.onnx")


def build_toy_model_dir(fixture_dir: Path, target: Path, with_frontend: bool = True) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "llm.pt", "flow.pt", "hift.pt"):
        os.symlink(fixture_dir / name, target / name)
    blank = target / "CosyVoice-BlankEN"
    blank.mkdir()
    qwen = json.loads((fixture_dir / "CosyVoice-BlankEN" / "config.json").read_text())
    if qwen["vocab_size"] < 256 + 20 + 8:
        raise ValueError(f"the fixture's Qwen vocabulary ({qwen['vocab_size']}) is too small for a byte-level BPE")
    (blank / "config.json").write_text(json.dumps(qwen))
    if with_frontend:
        # 20 special tokens follow the BPE vocabulary; all must index the reduced Qwen embedding table.
        _tokenizer_files(blank, vocab_size=qwen["vocab_size"] - 20)
        cfg = CosyVoice2Config.from_files(target / "config.yaml", blank / "config.json")
        _onnx_models(target, cfg.flow.spk_embed_dim, cfg.lm.speech_token_size)
    return target
