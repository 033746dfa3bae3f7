"""CosyVoice 2 tokenizer: special-token ids, CJK per-character masking, round trips.

The released BlankEN files cannot be shipped, so a small byte-level BPE is trained here in the same file format
(vocab.json + merges.txt + tokenizer_config.json declaring the three Qwen2 added tokens).
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cadenza.errors import CheckpointError
from cadenza.text.qwen_tokenizer import COSYVOICE2_SPECIAL_TOKENS, CosyVoice2Tokenizer

CORPUS = ["Hello world, this is a test of the tokenizer.", "你好世界，今天天气很好。", "hello 你好 world 世界"] * 50


@pytest.fixture(scope="module")
def blank_en(tmp_path_factory):
    directory = tmp_path_factory.mktemp("CosyVoice-BlankEN")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.model.save(str(directory))
    n = tok.get_vocab_size()
    added = {str(n + i): {"content": c, "special": True} for i, c in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    return directory, n


def test_special_token_ids_follow_the_release_order(blank_en):
    directory, n = blank_en
    tok = CosyVoice2Tokenizer(directory)
    assert tok.token_id("<|endoftext|>") == n
    assert tok.token_id("<|im_start|>") == n + 1
    # The 17 CosyVoice tokens are appended in list order after the 3 Qwen2 ones (151646.. on the release).
    for offset, token in enumerate(COSYVOICE2_SPECIAL_TOKENS[2:]):
        assert tok.token_id(token) == n + 3 + offset, token
    ids = tok.encode("用四川话说<|endofprompt|>hello [laughter] world")
    assert tok.token_id("<|endofprompt|>") in ids and tok.token_id("[laughter]") in ids


def test_cjk_characters_are_single_units(blank_en):
    directory, _ = blank_en
    masked, stock = CosyVoice2Tokenizer(directory), CosyVoice2Tokenizer(directory, split_cjk=False)
    text = "你好世界"
    assert len(stock.encode(text)) < len(text)  # the trained merges join CJK characters ...
    ids = masked.encode(text)
    assert all(sum(c in text for c in masked.decode([i])) <= 1 for i in ids)  # ... the masked tokenizer never does
    assert len(ids) >= len(text) and masked.decode(ids) == text
    assert masked.decode(masked.encode("hello 你好 world")) == "hello 你好 world"


def test_plain_text_matches_unmasked_encoding(blank_en):
    directory, _ = blank_en
    masked, stock = CosyVoice2Tokenizer(directory), CosyVoice2Tokenizer(directory, split_cjk=False)
    for text in ["Hello world, this is a test.", "  spaced   out  ", "a\nb\r\n c", "数字 12345 ok"[:2]]:
        assert masked.encode(text) == stock.encode(text)


def test_missing_files_give_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="vocab.json"):
        CosyVoice2Tokenizer(tmp_path)
