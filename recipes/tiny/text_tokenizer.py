"""Train cadenza-tiny's text tokenizer: a small byte-level BPE in the Qwen2 file format (`CosyVoice-BlankEN`).

    python recipes/tiny/text_tokenizer.py --corpus WORK/corpus/manifest.jsonl --out WORK/text_tokenizer

The released model uses Qwen2's 151,643-token vocabulary, whose embedding table alone would be ~40x the size budget
of the tiny model. A 490-token BPE (256 byte symbols + merges) trained on the training transcripts keeps words
spelled out in small pieces, so the LM learns letter-to-sound rules that carry over to unseen words. The files are
read by `cadenza.text.qwen_tokenizer.CosyVoice2Tokenizer` exactly like the release's (the same pre-tokenizer regex;
the CosyVoice special tokens are appended after the BPE ids, hence Qwen2 `vocab_size` = 512 >= 490 + 20).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BPE_VOCAB = 490


def train_text_tokenizer(manifest: Path, out: Path, vocab_size: int = BPE_VOCAB) -> int:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from cadenza.text.qwen_tokenizer import QWEN2_PRETOKENIZE_REGEX

    texts = [json.loads(line)["text"] for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(out))
    n = tok.get_vocab_size()
    added = {str(n + i): {"content": c, "special": True}
             for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    (out / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}, indent=1) + "\n")
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, type=Path, help="manifest.jsonl of the training corpus")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab-size", type=int, default=BPE_VOCAB)
    a = p.parse_args()
    n = train_text_tokenizer(a.corpus, a.out, a.vocab_size)
    from cadenza.text.qwen_tokenizer import CosyVoice2Tokenizer

    tok = CosyVoice2Tokenizer(a.out)
    sample = "Darkness was on the surface of the deep."
    print(f"{n} BPE tokens + specials = {tok.vocab_size}; {sample!r} -> {len(tok.encode(sample))} ids")


if __name__ == "__main__":
    main()
