"""Stateful chunk-by-chunk AudioVAE decoding for streaming synthesis (docs/design.md, "VoxCPM 2 streaming").

Each :meth:`StreamingAudioVAEDecoder.decode_chunk` call runs the decoder on the new latent frames only; the causal
convs continue from the left context kept in the decoder's :class:`ConvStreamState` (the reference patches the
shared modules' ``forward`` for this; here the state belongs to the request and the model stays untouched, so any
number of streams can run on one model). The concatenated chunks equal one-shot :meth:`AudioVAE.decode` of the
concatenated latents up to float rounding, for any chunking (1-frame chunks included).

Like the reference, a stream starts from silence: it is not warmed up on prompt latents. To continue after known
latents, decode them first and discard that audio.
"""

from __future__ import annotations

import torch

from cadenza.errors import InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_conv import ConvStreamState


class StreamingAudioVAEDecoder:
    """One decoding stream over a shared :class:`AudioVAE`.

    Args:
        vae: the model (not modified).
        sr_cond: sample-rate condition for the whole stream (default: the VAE's output rate).

    Usage::

        with StreamingAudioVAEDecoder(vae) as dec:
            for patch in patches:                  # [B, D, t] each
                chunk = dec.decode_chunk(patch)    # [B, 1, t * decode_hop_length]
    """

    def __init__(self, vae: AudioVAE, sr_cond: int | None = None) -> None:
        self._vae = vae
        self._sr_cond = sr_cond
        self._state = ConvStreamState()
        self._batch: int | None = None
        self._frames = 0
        self._closed = False

    # ---------------------------------------------------------------- state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def frames_decoded(self) -> int:
        """Latent frames decoded since the start (or the last :meth:`reset`)."""
        return self._frames

    @property
    def samples_decoded(self) -> int:
        """Output samples returned since the start (or the last :meth:`reset`)."""
        return self._frames * self._vae.decode_hop_length

    def reset(self) -> None:
        """Start a new stream: forget the context (the next chunk decodes from silence) and the batch size."""
        self._check_open()
        self._state.clear()
        self._batch = None
        self._frames = 0

    def close(self) -> None:
        """Release the context tensors; further :meth:`decode_chunk` calls raise. Closing twice is harmless."""
        self._state.clear()
        self._batch = None
        self._closed = True

    def __enter__(self) -> StreamingAudioVAEDecoder:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InputError("this streaming AudioVAE decoder is closed: open a new one with StreamingAudioVAEDecoder(vae)")

    # ---------------------------------------------------------------- decoding

    def decode_chunk(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode the next latent frames of the stream.

        Args:
            latents: ``[B, latent_dim, t]`` with ``t >= 1``; ``B`` must stay the same for the whole stream.

        Returns:
            ``[B, 1, t * decode_hop_length]`` waveform at the VAE's output rate, continuing the previous chunk.
        """
        self._check_open()
        z = self._vae.check_latents(latents)
        if self._batch is not None and z.shape[0] != self._batch:
            raise InputError(f"batch size changed within a stream ({self._batch} -> {z.shape[0]}): "
                             "call reset() or use one decoder per stream")
        bucket = self._vae.sr_bucket(self._sr_cond, z.shape[0])
        wav = self._vae.decoder(z, bucket, self._state)
        self._batch = z.shape[0]
        self._frames += z.shape[2]
        return wav
