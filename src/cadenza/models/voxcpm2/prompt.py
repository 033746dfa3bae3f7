"""Voice prompts from audio: reference / continuation audio -> AudioVAE latent patches.

See docs/design.md, "VoxCPM 2 prompt audio and decoding".

Steps, as the reference's ``_encode_wav``: decode to mono at the encoder rate (16 kHz; ``cadenza.audio.io``
resamples with soxr where the reference uses librosa's soxr_hq, so parity holds for 16 kHz input), check the clip
(``validate_prompt_audio``: finite, 0.5-30 s, not silent — the reference checks nothing), zero-pad to a multiple of
``patch_size · hop`` samples — **right** for reference audio, **left** for continuation audio so the prompt's last
patch is flush with the generation start — encode, and regroup the latent frames into patches
(frame ``P·j + p`` -> patch j, slot p).

The reference's optional VAD trim and denoiser are not part of this module (both are off by default there).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from cadenza.audio.io import AudioSource, load_audio
from cadenza.audio.prompt import mono_samples, validate_prompt_audio
from cadenza.audio.resample import resample
from cadenza.errors import AudioError, InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.layouts import VoicePrompt, latents_to_patches

# A path / bytes / binary file, or already-decoded ``(samples, sample_rate)``.
PromptAudio = AudioSource | tuple[np.ndarray | torch.Tensor, int]

MIN_PROMPT_SECONDS = 0.5  # shorter clips carry too little voice to copy (and are usually a mistake)
MAX_PROMPT_SECONDS = 30.0  # 30 s = 188 patches of the 8192-position context; longer prompts slow every step
PAD_SIDES = ("right", "left")


def load_prompt_audio(audio: PromptAudio, sample_rate: int, what: str = "prompt audio") -> torch.Tensor:
    """Decode ``audio`` to mono float32 ``[samples]`` at ``sample_rate`` and validate it.

    ``audio``: a path, raw file bytes, a binary file object, or a ``(samples, rate)`` pair (``samples``
    ``[n]``, ``[channels, n]`` or ``[n, channels]``; channels are averaged).
    Raises ``AudioError`` (unreadable, NaN, too short/long, silent) naming ``what``.
    """
    if isinstance(audio, tuple):
        if len(audio) != 2 or isinstance(audio[0], (str, bytes)):
            raise AudioError(f"{what}: pass a path, bytes, a binary file or a (samples, sample_rate) pair")
        samples, rate = audio
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
            raise AudioError(f"{what}: the sample rate must be a positive integer, got {rate!r}")
        try:
            wav = torch.as_tensor(np.asarray(samples, dtype=np.float32))
        except (TypeError, ValueError) as exc:
            raise AudioError(f"{what}: samples are not numeric audio ({exc})") from exc
        wav = mono_samples(wav, what)
        if wav.numel() == 0:
            raise AudioError(f"{what} holds no samples")
        if not bool(torch.isfinite(wav).all()):
            raise AudioError(f"{what} contains NaN or infinite samples")
        wav = resample(wav, int(rate), sample_rate)
    else:
        try:
            wav = load_audio(audio, sample_rate)
        except AudioError as exc:
            raise AudioError(f"{what}: {exc}") from exc
    try:
        validate_prompt_audio(wav, sample_rate, MIN_PROMPT_SECONDS, MAX_PROMPT_SECONDS)
    except AudioError as exc:
        raise AudioError(f"{what}: {exc}") from exc
    return wav


@torch.inference_mode()
def encode_patches(vae: AudioVAE, wav: torch.Tensor, patch_size: int, pad: str) -> torch.Tensor:
    """Mono ``wav`` ``[n]`` at ``vae.sample_rate`` -> latent patches ``[k, P, D]`` float32 on CPU.

    ``pad``: ``"right"`` (reference audio) or ``"left"`` (continuation audio): where the zeros go that round the
    length up to a multiple of ``patch_size · vae.hop_length`` samples.
    """
    if pad not in PAD_SIDES:
        raise InputError(f"pad must be one of {PAD_SIDES}, got {pad!r}")
    if wav.dim() != 1 or wav.numel() == 0:
        raise InputError(f"prompt audio must be a non-empty mono [samples] tensor, got {tuple(wav.shape)}")
    patch_samples = patch_size * vae.hop_length
    extra = -wav.numel() % patch_samples
    wav = F.pad(wav.to(torch.float32), (extra, 0) if pad == "left" else (0, extra))
    latents = vae.encode(wav[None], vae.sample_rate)  # [1, D, k·P]
    return latents_to_patches(latents.float().cpu(), patch_size)


def build_voice_prompt(
    vae: AudioVAE,
    patch_size: int,
    reference_wav: PromptAudio | None = None,
    prompt_wav: PromptAudio | None = None,
    prompt_text: str | None = None,
) -> VoicePrompt | None:
    """The reference's ``build_prompt_cache``: ``None`` when no audio is given (zero-shot / voice design).

    ``prompt_wav`` (continuation) needs its transcript ``prompt_text`` and vice versa; ``reference_wav`` is
    independent. Raises ``InputError`` / ``AudioError`` with a message naming the argument.
    """
    if prompt_wav is not None and prompt_text is None:
        raise InputError("prompt_wav continues a recording and needs its transcript: pass prompt_text as well "
                         "(or pass the clip as reference_wav to clone the voice without a transcript)")
    if prompt_text is not None and prompt_wav is None:
        raise InputError("prompt_text is the transcript of prompt_wav: pass prompt_wav as well")
    if prompt_text is not None:
        if not isinstance(prompt_text, str) or not prompt_text.strip():
            raise InputError("prompt_text must be the non-empty transcript of prompt_wav")
    if reference_wav is None and prompt_wav is None:
        return None
    rate = vae.sample_rate
    ref = prompt = None
    if reference_wav is not None:
        ref = encode_patches(vae, load_prompt_audio(reference_wav, rate, "reference_wav"), patch_size, "right")
    if prompt_wav is not None:
        prompt = encode_patches(vae, load_prompt_audio(prompt_wav, rate, "prompt_wav"), patch_size, "left")
    return VoicePrompt(ref_patches=ref, prompt_text=prompt_text, prompt_patches=prompt)
