"""VoxCPM 2 text tokenizer: the MiniCPM-4 SentencePiece-style BPE from ``tokenizer.json`` + the CJK split.

See docs/design.md, "VoxCPM 2 text tokenizer".

Built on the ``tokenizers`` library with the settings ``transformers``' ``LlamaTokenizerFast`` uses (v5 rebuilds
them; v4 reads the same behaviour from the JSON): no normalizer, a Metaspace pre-tokenizer (``▁`` replaces spaces
and is prepended; ``prepend_scheme`` "always" when ``tokenizer_config.json`` says ``legacy: true``, else "first";
no splitting), BPE with byte fallback. No BOS/EOS is added.

CJK split: every produced token whose text without ``▁`` is a multi-character vocabulary entry made only of
U+4E00–U+9FFF characters is replaced by its single characters (the ``▁`` is dropped), so Chinese is always one id
per character.

Unknown characters (neither in the vocabulary nor representable by ``<0xXX>`` byte tokens): the reference with
transformers >= 5 silently drops them. We never drop text: by default they become the ``<unk>`` id (what
transformers 4.x produced) and a warning names them; ``on_unknown="raise"`` raises ``TextError`` instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cadenza.errors import CheckpointError, TextError

log = logging.getLogger(__name__)

METASPACE = "\u2581"
CJK_RANGE = ("\u4e00", "\u9fff")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _is_cjk(text: str) -> bool:
    return all(CJK_RANGE[0] <= c <= CJK_RANGE[1] for c in text)


class VoxCPM2Tokenizer:
    """``encode(text) -> list[int]``; ``tokenize`` / ``base_tokenize`` give the token strings."""

    def __init__(self, directory: str | Path, on_unknown: str = "unk") -> None:
        from tokenizers import Tokenizer, pre_tokenizers

        if on_unknown not in ("unk", "raise"):
            raise ValueError(f"on_unknown must be 'unk' or 'raise', got {on_unknown!r}")
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise CheckpointError(f"tokenizer file missing: {path}")
        settings = self._read_config(directory / TOKENIZER_CONFIG_FILE)
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        if type(tok.model).__name__ != "BPE":
            raise CheckpointError(f"{path}: expected a BPE model, found {type(tok.model).__name__}")
        unk = settings.get("unk_token", tok.model.unk_token or "<unk>")
        unk = unk.get("content") if isinstance(unk, dict) else unk
        vocab = tok.get_vocab(with_added_tokens=True)
        if unk in vocab:
            tok.model.unk_token = unk  # never let BPE drop a character silently
        tok.normalizer = None
        scheme = "always" if settings.get("legacy", False) else "first"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=scheme, split=False)
        tok.post_processor = None  # no BOS/EOS
        self._tok = tok
        self.on_unknown = on_unknown
        self.unk_token = unk if unk in vocab else None
        self.unk_id = vocab.get(unk)
        self._vocab = vocab
        self._multichar_cjk = {t for t in vocab if len(t) >= 2 and _is_cjk(t)}

    @staticmethod
    def _read_config(path: Path) -> dict:
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CheckpointError(f"cannot parse {path}: {exc}") from exc

    def token_id(self, token: str) -> int | None:
        """Id of one vocabulary entry (e.g. ``"▁"`` or ``"b"``), None when absent."""
        return self._vocab.get(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def base_tokenize(self, text: str) -> list[str]:
        """Token strings of the base BPE (before the CJK split)."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def tokenize(self, text: str) -> list[str]:
        """Token strings after the CJK split."""
        return [t for _, t in self._split(text)]

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no BOS/EOS). Unknown characters: see the module docstring."""
        if not isinstance(text, str):
            raise TextError(f"text must be a string, got {type(text).__name__}")
        ids, unknown = [], []
        for source, token in self._split(text):
            token_id = self._vocab.get(token, self.unk_id)
            if token_id is None or (token_id == self.unk_id and source != self.unk_token):
                unknown.append(source)
            ids.append(token_id)
        if unknown:
            if self.on_unknown == "raise" or self.unk_id is None:
                raise TextError(f"text {text!r} contains characters the tokenizer cannot represent: {unknown}")
            log.warning("characters without a token in %r mapped to %s: %s", text, self.unk_token, unknown)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (the inverse of ``encode`` up to the leading ``▁``; special tokens are skipped)."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def _split(self, text: str) -> list[tuple[str, str]]:
        """``(source text, token)`` pairs after the CJK split (source = the characters the token stands for)."""
        enc = self._tok.encode(text, add_special_tokens=False)
        out: list[tuple[str, str]] = []
        for token, (a, b) in zip(enc.tokens, enc.offsets):
            bare = token.replace(METASPACE, "")
            if bare in self._multichar_cjk:
                out.extend((c, c) for c in bare)
            else:
                out.append((text[a:b], token))
        return out

    __call__ = encode
