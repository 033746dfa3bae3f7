"""The CosyVoice 2 text tokenizer: Qwen2 byte-level BPE from ``CosyVoice-BlankEN`` plus CosyVoice's special tokens.

Built directly on the ``tokenizers`` library from ``vocab.json`` + ``merges.txt`` (the same normalizer,
pre-tokenizer regex and byte-level mapping as Qwen2's fast tokenizer), so ids do not depend on the installed
``transformers`` version.

Multi-character CJK masking (docs/design.md, "Qwen2 tokenizer and CosyVoice 2 special tokens"): every CJK character is
its own BPE unit. The release bakes this into ``merges.txt``; we also enforce it here (a pre-token holding several CJK
characters is split per character before BPE), which changes nothing with the BlankEN files and gives the paper's
behaviour with stock Qwen2 merges.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

from cadenza.errors import CheckpointError

# Qwen2's pre-tokenizer regex (transformers' Qwen2 tokenizer).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Appended by CosyVoice2Tokenizer in this order: <|endofprompt|> becomes 151646 on the release
# (docs/design.md, "Qwen2 tokenizer and CosyVoice 2 special tokens").
COSYVOICE2_SPECIAL_TOKENS = (
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]",
    "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>",
    "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]", "[mn]",
)
ENDOFTEXT = "<|endoftext|>"
ENDOFPROMPT = "<|endofprompt|>"

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")


def _is_cjk(ch: str) -> bool:
    return bool(_CJK.match(ch))


class CosyVoice2Tokenizer:
    """Text -> Qwen2 token ids (no BOS/EOS added); special tags like ``[laughter]`` map to single ids."""

    def __init__(self, directory: str | Path, split_cjk: bool = True) -> None:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import BPE

        directory = Path(directory)
        vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
        missing = [p.name for p in (vocab_path, merges_path) if not p.is_file()]
        if missing:
            raise CheckpointError(
                f"tokenizer files missing in {directory}: {', '.join(missing)} "
                "(CosyVoice 2 needs CosyVoice-BlankEN/vocab.json and merges.txt; or pass token ids directly)"
            )
        try:
            vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
            merges = [
                tuple(line.split(" ", 1))
                for line in merges_path.read_text(encoding="utf-8").splitlines()
                if line and not line.startswith("#version")
            ]
            tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise CheckpointError(f"cannot build the tokenizer from {directory}: {exc}") from exc
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()

        # Tokens the config already declares (Qwen2: <|endoftext|>, <|im_start|>, <|im_end|>), at their declared ids.
        declared = self._declared_added_tokens(directory / "tokenizer_config.json")
        for token_id, content in sorted(declared.items()):
            got = tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
            if got and tok.token_to_id(content) != token_id:
                raise CheckpointError(
                    f"{directory}: added token {content!r} declared with id {token_id} "
                    f"but lands at {tok.token_to_id(content)}"
                )
        for content in (ENDOFTEXT, *COSYVOICE2_SPECIAL_TOKENS):
            if tok.token_to_id(content) is None:
                tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        self._tok = tok
        self._pretok = pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False)
        self.split_cjk = split_cjk
        specials = sorted((c for c in tok.get_added_tokens_decoder().values()), key=lambda t: -len(t.content))
        self._special_ids = {t.content: tok.token_to_id(t.content) for t in specials}
        self._special_re = re.compile("|".join(re.escape(t.content) for t in specials)) if specials else None

    @staticmethod
    def _declared_added_tokens(config_path: Path) -> dict[int, str]:
        if not config_path.is_file():
            return {}
        try:
            cfg = json.loads(config_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CheckpointError(f"cannot parse {config_path}: {exc}") from exc
        decoder = cfg.get("added_tokens_decoder") or {}
        return {int(k): v["content"] for k, v in decoder.items() if isinstance(v, dict) and "content" in v}

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise KeyError(token)
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tags are matched literally and map to their single ids."""
        text = unicodedata.normalize("NFC", text)
        ids: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text) if self._special_re else ():
            ids += self._encode_plain(text[pos : m.start()])
            ids.append(self._special_ids[m.group(0)])
            pos = m.end()
        ids += self._encode_plain(text[pos:])
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        if not self.split_cjk or not any(_is_cjk(c) for c in text):
            return self._tok.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        start = 0
        for _, (a, b) in self._pretok.pre_tokenize_str(text):
            piece = text[a:b]
            if sum(_is_cjk(c) for c in piece) < 2:
                continue
            if a > start:
                ids += self._tok.encode(text[start:a], add_special_tokens=False).ids
            cut = 0
            for i, ch in enumerate(piece):  # each CJK char starts a new unit; a leading non-CJK prefix stays attached
                if _is_cjk(ch) and any(_is_cjk(c) for c in piece[cut:i]):
                    ids += self._tok.encode(piece[cut:i], add_special_tokens=False).ids
                    cut = i
            ids += self._tok.encode(piece[cut:], add_special_tokens=False).ids
            start = b
        if start < len(text):
            ids += self._tok.encode(text[start:], add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
