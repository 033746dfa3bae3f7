"""CosyVoice 2 frontend: text -> token ids, prompt audio -> speech tokens, prompt mel and x-vector (spec §3.3, §5).

Optional parts (tokenizer files, the two ONNX models) are loaded on first use, so a directory without them still
serves requests given as token ids; a feature that needs a missing part fails with a message naming the file.
"""

from __future__ import annotations

import re
import threading

import torch

from cadenza.audio.kaldi_fbank import campplus_features
from cadenza.audio.mel import flow_prompt_mel
from cadenza.audio.prompt import validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.audio.whisper_mel import whisper_log_mel
from cadenza.errors import CheckpointError, TextError
from cadenza.models.cosyvoice2.config import CosyVoice2Config
from cadenza.models.cosyvoice2.loader import CosyVoice2Files
from cadenza.models.cosyvoice2.speakers import SpeakerPrompt
from cadenza.text.phonemes import PHONEMES_FILE, PhonemeTokenizer
from cadenza.text.qwen_tokenizer import ENDOFPROMPT, CosyVoice2Tokenizer

SPEECH_TOKENIZER_SR = 16000
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
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def feed(self, piece: str) -> list[int]:
        return self.tokenizer.encode(piece)

    def flush(self) -> list[int]:
        return []


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
                        f"{self.files.directory} has no text tokenizer (CosyVoice-BlankEN/vocab.json + merges.txt): "
                        "pass token ids instead of text (text_ids=..., CLI --text-ids)"
                    )
                if (self.files.tokenizer_dir / PHONEMES_FILE).is_file():
                    self._tokenizer = PhonemeTokenizer.from_dir(self.files.tokenizer_dir)
                else:
                    self._tokenizer = CosyVoice2Tokenizer(self.files.tokenizer_dir)
            return self._tokenizer

    @property
    def reads_phonemes(self) -> bool:
        return isinstance(self.tokenizer, PhonemeTokenizer)

    def text_stream_encoder(self):
        """An object with ``feed(piece) -> ids`` and ``flush() -> ids`` for text that arrives in pieces: BPE encodes
        each piece as it comes (as the reference does); phonemes wait for whole words."""
        tokenizer = self.tokenizer
        if isinstance(tokenizer, PhonemeTokenizer):
            return tokenizer.stream_encoder()
        return _PieceEncoder(tokenizer)

    def _audio_model(self, attr: str):
        """The speech tokenizer / speaker encoder: our own trained one (safetensors) if the folder has it, else
        the release's ONNX model (the ``onnx`` extra)."""
        from cadenza.models import speaker_encoder, speech_tokenizer
        from cadenza.models.cosyvoice2 import onnx_models

        with self._lock:
            if getattr(self, attr) is None:
                d = self.files.directory
                if attr == "_speech_tokenizer":
                    native, onnx_path, onnx_cls, name = (speech_tokenizer.find_speech_tokenizer(d),
                                                         self.files.speech_tokenizer, onnx_models.OnnxSpeechTokenizer,
                                                         "speech_tokenizer_v2.onnx (or speech_tokenizer.safetensors)")
                    load_native = speech_tokenizer.load_speech_tokenizer
                else:
                    native, onnx_path, onnx_cls, name = (speaker_encoder.find_speaker_encoder(d), self.files.campplus,
                                                         onnx_models.CampPlusSpeakerEncoder,
                                                         "campplus.onnx (or speaker_encoder.safetensors)")
                    load_native = speaker_encoder.load_speaker_encoder
                if native is not None:
                    setattr(self, attr, load_native(native))
                elif onnx_path is not None:
                    setattr(self, attr, onnx_cls(onnx_path))
                else:
                    raise CheckpointError(f"{d} has no {name}: prompt audio cannot be used")
            return getattr(self, attr)

    # -- text ----------------------------------------------------------------------------------------------------
    def text_ids(self, text: str, what: str = "text") -> torch.Tensor:
        ids = self.tokenizer.encode(check_speakable(text, what))
        if not ids:
            raise TextError(f"{what} produced no tokens")
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
        tokenizer = self._audio_model("_speech_tokenizer")
        return tokenizer(whisper_log_mel(wav16k, n_mels=128))

    def speaker_embedding(self, wav16k: torch.Tensor) -> torch.Tensor:
        """wav ``[N]`` at 16 kHz -> x-vector ``[1, 192]``."""
        encoder = self._audio_model("_speaker_encoder")
        return encoder(campplus_features(wav16k))

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
