"""CosyVoice 2 frontend: text -> token ids, prompt audio -> speech tokens, prompt mel and x-vector.

See docs/design.md, "CosyVoice 2 frontend inputs per mode" and "Audio features".

A directory without the optional parts (tokenizer files, the two ONNX models or our safetensors replacements) still
serves requests given as token ids; a feature that needs a missing part fails with a message naming the file.
``load_all`` (called by ``Cadenza.from_pretrained``) loads every part that is present and runs each once on a fixed
input, so a broken file is a ``CheckpointError`` at start-up; used without it (data preparation), parts load on
first use. Whatever the part, a failure inside it at run time is a ``CheckpointError`` (or a plain RuntimeError
from torch), never an ``InputError``: the client's text and audio were checked before they reached it.
"""

from __future__ import annotations

import logging
import re
import threading

import torch

from cadenza.audio.kaldi_fbank import campplus_features
from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.prompt import validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.audio.whisper_mel import whisper_log_mel
from cadenza.errors import CheckpointError, MissingDependencyError, TextError
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.loader import QWEN_DIR, CosyVoice2Files
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt
from cadenza.text.lexicon import PHONEME_SPAN
from cadenza.text.markdown_stream import MarkdownStream
from cadenza.text.phonemes import PHONEMES_FILE, PhonemeTokenizer, drop_tags
from cadenza.text.qwen_tokenizer import ENDOFPROMPT, CosyVoice2Tokenizer

log = logging.getLogger(__name__)

SPEECH_TOKENIZER_SR = 16000
WHISPER_MELS = 128  # speech tokenizer input: whisper log-mel bins, 100 frames/s
FBANK_BINS = 80  # speaker encoder input: Kaldi fbank bins
# The start-up check runs each audio model on one second of fixed features, and the tokenizer on one sentence.
PROBE_FRAMES = 100
PROBE_TEXT = "Hello, world."
# Nothing speakable: only punctuation, symbols and spaces (\W without letters/digits; '_' counts as a symbol).
_UNSPEAKABLE = re.compile(r"^[\W_]*$")
# Paralinguistic tags ([laughter], <strong>, <|endofprompt|>) are speakable on their own.
_TAG = re.compile(r"\[[a-z_-]+\]|</?[a-z]+>|<\|[a-z_]+\|>")


def is_speakable(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and (not _UNSPEAKABLE.match(stripped) or bool(_TAG.search(stripped)))


def check_speakable(text: str, what: str = "text") -> str:
    if not isinstance(text, str):
        raise TextError(f"{what} must be a string, not {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise TextError(f"{what} is empty")
    if _UNSPEAKABLE.match(stripped) and not _TAG.search(stripped):
        raise TextError(f"{what} has nothing to speak (only punctuation or symbols): {stripped[:40]!r}")
    return stripped


class _PieceEncoder:
    """BPE over pieces: each piece encoded as it comes, except a piece of whitespace alone, and without Markdown.

    An upstream LLM may send the space between two words as a piece of its own ("Hello", " ", "there"). Encoded
    alone it becomes a token the model never reads in a whole text, where the space starts the next word's token
    (" there"); so it is held and goes out in front of the next piece (at the end of the text, nowhere). An LLM also
    writes Markdown, which whole texts lose in ``normalize``: ``MarkdownStream`` drops it from the pieces (holding
    back only the markers the next piece decides)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.spacing = ""
        self.markdown = MarkdownStream()

    def _encode(self, piece: str) -> list[int]:
        if not piece.strip():
            self.spacing += piece
            return []
        piece, self.spacing = self.spacing + piece, ""
        return self.tokenizer.encode(piece)

    def feed(self, piece: str) -> list[int]:
        return self._encode(self.markdown.feed(piece))

    def flush(self) -> list[int]:
        ids = self._encode(self.markdown.flush())
        self.spacing = ""
        return ids


class CosyVoice2Frontend:
    def __init__(self, files: CosyVoice2Files, config: CosyVoice2Config) -> None:
        self.files = files
        self.config = config
        self._lock = threading.Lock()
        self._tokenizer: CosyVoice2Tokenizer | None = None
        self._speaker_encoder = None
        self._speech_tokenizer = None

    # -- lazily loaded parts -------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> CosyVoice2Tokenizer:
        with self._lock:
            if self._tokenizer is None:
                if self.files.tokenizer_dir is None:
                    raise CheckpointError(
                        f"{self.files.directory.name} has no text tokenizer (CosyVoice-BlankEN/vocab.json + "
                        "merges.txt): pass token ids instead of text (text_ids=..., CLI --text-ids)"
                    )
                try:
                    if (self.files.tokenizer_dir / PHONEMES_FILE).is_file():
                        self._tokenizer = PhonemeTokenizer.from_dir(self.files.tokenizer_dir)
                    else:
                        self._tokenizer = CosyVoice2Tokenizer(self.files.tokenizer_dir)
                except (CheckpointError, MissingDependencyError):
                    raise
                except Exception as exc:  # noqa: BLE001 - a malformed tokenizer file fails in many ways
                    raise CheckpointError(f"cannot build the text tokenizer from {self.files.tokenizer_dir}: "
                                          f"{type(exc).__name__}: {exc}") from exc
            return self._tokenizer

    def speakable(self, text: str) -> bool:
        """``is_speakable`` for this model: a phoneme model drops the tags it cannot perform (``[laughter]``,
        ``<strong>``: ``drop_tags``), so a text of only tags has nothing to speak there and is skipped where a text
        stream or an SSML run meets it, instead of failing as a segment with no ids."""
        if not self.reads_phonemes:
            return is_speakable(text)
        return PHONEME_SPAN.search(text) is not None or is_speakable(drop_tags(text))  # a phoneme span is speech

    @property
    def reads_phonemes(self) -> bool:
        """Whether the text tokenizer is a ``PhonemeTokenizer`` (the folder has ``phonemes.json``), from the folder's
        files: nothing is loaded, and a folder without a tokenizer reads none (``capabilities`` asks any model)."""
        folder = self.files.tokenizer_dir
        return folder is not None and (folder / PHONEMES_FILE).is_file()

    @property
    def one_sentence_per_segment(self) -> bool:
        """Whether the LM reads one sentence at a time (``PhonemeTokenizer.one_sentence_per_segment``), from the
        folder's files: no tokenizer is loaded, and a folder without one reads none."""
        return self.reads_phonemes and PhonemeTokenizer.one_sentence_per_segment

    def text_stream_encoder(self):
        """An object with ``feed(piece) -> ids`` and ``flush() -> ids`` for text that arrives in pieces: BPE encodes
        each piece as it comes (as the reference does; whitespace alone joins the next piece); phonemes wait for
        whole words."""
        tokenizer = self.tokenizer
        if isinstance(tokenizer, PhonemeTokenizer):
            return tokenizer.stream_encoder()
        return _PieceEncoder(tokenizer)

    def _audio_source(self, attr: str):
        """(loader, path, what) of the speech tokenizer / speaker encoder: our own trained one (safetensors) if the
        folder has it, else the release's ONNX model (the ``onnx`` extra); path None when the folder has neither."""
        from cadenza.models import speaker_encoder, speech_tokenizer
        from cadenza.models.cosyvoice2 import onnx_models

        d = self.files.directory
        if attr == "_speech_tokenizer":
            native, load_native = speech_tokenizer.find_speech_tokenizer(d), speech_tokenizer.load_speech_tokenizer
            onnx_path, onnx_cls = self.files.speech_tokenizer, onnx_models.OnnxSpeechTokenizer
            what = "speech_tokenizer_v2.onnx (or speech_tokenizer.safetensors)"
        else:
            native, load_native = speaker_encoder.find_speaker_encoder(d), speaker_encoder.load_speaker_encoder
            onnx_path, onnx_cls = self.files.campplus, onnx_models.CampPlusSpeakerEncoder
            what = "campplus.onnx (or speaker_encoder.safetensors)"
        if native is not None:
            return load_native, native, what
        return onnx_cls, onnx_path, what

    @property
    def has_speech_tokenizer(self) -> bool:
        """Whether the folder has a speech tokenizer (trained or ONNX); nothing is loaded."""
        return self._audio_source("_speech_tokenizer")[1] is not None

    @property
    def has_speaker_encoder(self) -> bool:
        """Whether the folder has a speaker encoder (trained or ONNX); nothing is loaded."""
        return self._audio_source("_speaker_encoder")[1] is not None

    def _audio_model(self, attr: str):
        """The speech tokenizer / speaker encoder, loaded on first use (or by ``load_all``)."""
        with self._lock:
            if getattr(self, attr) is None:
                load, path, what = self._audio_source(attr)
                if path is None:
                    raise CheckpointError(f"{self.files.directory.name} has no {what}: prompt audio cannot be used")
                setattr(self, attr, load(path))
            return getattr(self, attr)

    # -- start-up checks -----------------------------------------------------------------------------------------
    def load_all(self) -> None:
        """Load every frontend part the folder has and run each once on a fixed input; raises ``CheckpointError``
        naming the file when one is broken or does not fit the model (vocabulary sizes, embedding size, token
        rate). Parts the folder lacks stay absent (requests that need them fail with a message naming them); so do
        the ONNX models when onnxruntime is not installed (a warning is logged)."""
        self._check_bundle_pairs()
        if self.files.tokenizer_dir is not None:
            self._check_tokenizer()
        for attr in ("_speech_tokenizer", "_speaker_encoder"):
            if self._audio_source(attr)[1] is not None:
                try:
                    self._check_audio_model(attr)
                except MissingDependencyError as exc:
                    # The onnx extra is optional: text and saved speakers still work, prompt audio fails with this
                    # message until it is installed (a server should install it: docs/server.md).
                    log.warning("%s: %s; prompt audio cannot be used", self.files.directory, exc)

    def _check_bundle_pairs(self) -> None:
        from cadenza.models import speaker_encoder, speech_tokenizer

        d = self.files.directory
        for mod in (speech_tokenizer, speaker_encoder):
            pair = (mod.WEIGHTS_NAME, mod.CONFIG_NAME)
            present = [n for n in pair if (d / n).exists() or (d / n).is_symlink()]
            if len(present) == 1:
                other = next(n for n in pair if n not in present)
                raise CheckpointError(f"{d} has {present[0]} but not {other}: the two files come together")

    def _check_tokenizer(self) -> None:
        tokenizer = self.tokenizer
        vocab = self.config.lm.qwen.vocab_size
        if isinstance(tokenizer, PhonemeTokenizer):
            source = f"{QWEN_DIR}/{PHONEMES_FILE}"
            bad = [s for s in tokenizer.table.symbols if not isinstance(s, str) or not s]
            if bad:
                raise CheckpointError(f"{source}: every symbol must be a non-empty string, got {bad[0]!r}")
            size = len(tokenizer.table.symbols)
        else:
            source, size = f"{QWEN_DIR}/vocab.json", tokenizer.vocab_size
        if size > vocab:
            raise CheckpointError(f"{source}: the tokenizer has {size} ids but the LM's text embedding "
                                  f"({QWEN_DIR}/config.json vocab_size) only {vocab}")
        try:
            ids = tokenizer.encode(PROBE_TEXT)
        except MissingDependencyError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. espeak-ng has no voice for the table's language
            raise CheckpointError(f"{source}: the tokenizer fails on {PROBE_TEXT!r}: {exc}") from exc
        if not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
            raise CheckpointError(f"{source}: the tokenizer turns {PROBE_TEXT!r} into {ids!r}, not ids in "
                                  f"[0, {vocab})")

    def _check_audio_model(self, attr: str) -> None:
        path = self._audio_source(attr)[1]
        try:
            self._probe_audio_model(attr, self._audio_model(attr), path)
        except CheckpointError as exc:
            if path.name in str(exc):
                raise
            raise CheckpointError(f"{path.name}: {exc}") from exc

    def _probe_audio_model(self, attr: str, model, path) -> None:
        cfg = getattr(model, "config", None)  # our safetensors models carry their config
        generator = torch.Generator().manual_seed(0)
        if attr == "_speech_tokenizer":
            if cfg is not None and cfg.n_mels != WHISPER_MELS:
                raise CheckpointError(f"{path}: the speech tokenizer reads {cfg.n_mels} mel bins; the frontend gives "
                                      f"{WHISPER_MELS}")
            if cfg is not None and cfg.codebook_size > self.config.lm.speech_token_size:
                raise CheckpointError(f"{path}: the speech tokenizer has {cfg.codebook_size} ids but the model's "
                                      f"speech_token_size is {self.config.lm.speech_token_size}")
            feats = torch.randn(1, WHISPER_MELS, PROBE_FRAMES, generator=generator) * 0.5
            self._checked_tokens(self._run_part("speech tokenizer", model, feats), PROBE_FRAMES)
        else:
            dim = self.config.flow.spk_embed_dim
            if cfg is not None and (cfg.n_mels != FBANK_BINS or cfg.embedding_size != dim):
                raise CheckpointError(f"{path}: the speaker encoder maps {cfg.n_mels} fbank bins to "
                                      f"{cfg.embedding_size}-d; the model needs {FBANK_BINS} -> {dim}")
            feats = torch.randn(1, PROBE_FRAMES, FBANK_BINS, generator=generator)
            self._checked_embedding(self._run_part("speaker encoder", model, feats))

    # -- running the audio models --------------------------------------------------------------------------------
    @staticmethod
    def _run_part(what: str, model, features: torch.Tensor) -> torch.Tensor:
        try:
            return model(features)
        except (CheckpointError, RuntimeError):
            raise
        except Exception as exc:  # noqa: BLE001 - an input error from inside a model is the model's, not the client's
            raise CheckpointError(f"the {what} failed: {type(exc).__name__}: {exc}") from exc

    def _checked_tokens(self, ids, frames: int) -> torch.Tensor:
        """Speech token ids ``[1, T]`` at the model's token rate and inside its vocabulary, else ``CheckpointError``."""
        size = self.config.lm.speech_token_size
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise CheckpointError(f"the speech tokenizer gave {type(ids).__name__} {getattr(ids, 'dtype', '')}, "
                                  "not integer ids")
        ids = ids.reshape(1, -1).long()
        expected = frames * self.config.token_frame_rate // 100  # whisper log-mel: 100 frames/s
        if abs(ids.shape[1] - expected) > 1:
            raise CheckpointError(f"the speech tokenizer gave {ids.shape[1]} tokens for {frames} mel frames; the model "
                                  f"reads {self.config.token_frame_rate} tokens/s ({expected})")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise CheckpointError(f"the speech tokenizer gave ids in [{int(ids.min())}, {int(ids.max())}], outside "
                                  f"the model's speech vocabulary [0, {size})")
        return ids

    def _checked_embedding(self, embedding) -> torch.Tensor:
        dim = self.config.flow.spk_embed_dim
        if not isinstance(embedding, torch.Tensor) or embedding.numel() != dim:
            raise CheckpointError(f"the speaker encoder gave {tuple(getattr(embedding, 'shape', ()))}, not a "
                                  f"{dim}-d embedding")
        embedding = embedding.reshape(1, dim).float()
        if not bool(torch.isfinite(embedding).all()):
            raise CheckpointError("the speaker encoder gave a non-finite embedding")
        return embedding

    # -- text ----------------------------------------------------------------------------------------------------
    def text_ids(self, text: str, what: str = "text") -> torch.Tensor:
        """Ids ``[1, N]`` of ``text``; an LM that reads one sentence at a time gets its segment ending as a sentence
        does (``PhonemeTokenizer.ending_a_sentence``)."""
        ids = self.tokenizer.encode(check_speakable(text, what))
        if not ids:
            raise TextError(f"{what} produced no tokens")
        if what == "text" and self.one_sentence_per_segment:
            ids = self.tokenizer.ending_a_sentence(ids)
        return torch.tensor([ids], dtype=torch.long)

    def instruct_ids(self, instruct: str) -> torch.Tensor:
        """Instruct text (not normalised, as in the reference), ending in ``<|endofprompt|>``."""
        instruct = check_speakable(instruct, "instruct text")
        if self.reads_phonemes:
            raise TextError("this model reads phonemes and was not trained with instructions: leave out instruct")
        if not instruct.endswith(ENDOFPROMPT):
            instruct += ENDOFPROMPT
        return torch.tensor([self.tokenizer.encode(instruct)], dtype=torch.long)

    # -- audio ---------------------------------------------------------------------------------------------------
    def speech_tokens(self, wav16k: torch.Tensor) -> torch.Tensor:
        """wav ``[N]`` at 16 kHz -> speech token ids ``[1, T]``."""
        feats = whisper_log_mel(wav16k, n_mels=WHISPER_MELS)  # AudioError here is about the client's audio
        tokens = self._run_part("speech tokenizer", self._audio_model("_speech_tokenizer"), feats)
        return self._checked_tokens(tokens, feats.shape[2])

    def speaker_embedding(self, wav16k: torch.Tensor) -> torch.Tensor:
        """wav ``[N]`` at 16 kHz -> x-vector ``[1, 192]``."""
        feats = campplus_features(wav16k, num_mel_bins=FBANK_BINS)
        return self._checked_embedding(self._run_part("speaker encoder", self._audio_model("_speaker_encoder"), feats))

    def prompt_from_audio(self, wav: torch.Tensor, sample_rate: int, prompt_text: str | None = None,
                          trim: bool = True) -> SpeakerPrompt:
        """A voice from prompt audio ``[N]`` at any rate; ``prompt_text`` is its transcript (zero-shot) or None.

        With ``trim`` the prompt mel and tokens are cut to a common length ``n = min(frames // 2, tokens)`` as the
        reference does for every mode but VC; we also trim for VC (the reference's untrimmed VC prompt overlaps
        the generated region when the mel is longer than 2x the tokens).
        """
        validate_prompt_audio(wav, sample_rate)
        wav16k = resample(wav, sample_rate, SPEECH_TOKENIZER_SR)
        wav24k = resample(wav, sample_rate, self.config.sample_rate)
        tokens = self.speech_tokens(wav16k)
        mel = flow_prompt_mel(wav24k, self.config.mel).transpose(1, 2)  # [1, frames, 80]
        if trim:
            n = min(mel.shape[1] // self.config.token_mel_ratio, tokens.shape[1])
            mel, tokens = mel[:, : self.config.token_mel_ratio * n], tokens[:, :n]
        text = self.text_ids(prompt_text, "prompt text") if prompt_text is not None else torch.zeros(1, 0, dtype=torch.long)
        return SpeakerPrompt(
            prompt_text=text,
            llm_prompt_speech=tokens if prompt_text is not None else torch.zeros(1, 0, dtype=torch.long),
            flow_prompt_speech=tokens,
            prompt_mel=mel,
            embedding=self.speaker_embedding(wav16k),
        )
