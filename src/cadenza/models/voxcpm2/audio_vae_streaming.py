"""Stateful chunk-by-chunk AudioVAE decoding for streaming synthesis (docs/design.md, "VoxCPM 2 streaming").

Each :meth:`StreamingAudioVAEDecoder.decode_chunk` call runs the decoder on the new latent frames only; the causal
convs continue from the left context kept in the decoder's :class:`ConvStreamState` (the reference patches the
shared modules' ``forward`` for this; here the state belongs to the request and the model stays untouched, so any
number of streams can run on one model). The concatenated chunks equal one-shot :meth:`AudioVAE.decode` of the
concatenated latents up to float rounding, for any chunking (1-frame chunks included).

Like the reference, a stream starts from silence: it is not warmed up on prompt latents. To continue after known
latents, decode them first and discard that audio.

:meth:`StreamingAudioVAEDecoder.decode_many` decodes the next chunk of several streams (batch-1 streams, same chunk
length) in one decoder call, each row continuing its own stream's context: the scheduler's batched decoding.
"""

from __future__ import annotations

import torch

from cadenza.errors import InputError
from cadenza.models.voxcpm2.audio_vae import AudioVAE
from cadenza.models.voxcpm2.audio_vae_conv import ConvStreamState


class _StackedStreamState:
    """The :class:`ConvStreamState` of B batch-1 streams seen as one batch (row i = stream i) for one decoder call:
    each layer's context is the rows' contexts stacked, and the new context goes back to each stream. (It reads the
    states' context dict directly: the states are this module's streams, touched by nothing else meanwhile.)"""

    def __init__(self, states: list[ConvStreamState]) -> None:
        self._states = states

    def extend(self, layer: torch.nn.Module, x: torch.Tensor, context: int) -> torch.Tensor:
        """As :meth:`ConvStreamState.extend`, for ``x`` ``[B, C, T]`` with row i from stream i."""
        zeros = None
        rows = []
        for state in self._states:
            prev = state._context.get(layer)
            if prev is None:
                zeros = zeros if zeros is not None else x.new_zeros(1, x.shape[1], context)
                prev = zeros
            rows.append(prev)
        full = torch.cat([torch.cat(rows), x], dim=-1)
        tail = full[..., -context:].detach()
        for i, state in enumerate(self._states):
            state._context[layer] = tail[i : i + 1]
        return full


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

    @staticmethod
    def decode_many(decoders: list[StreamingAudioVAEDecoder], latents: torch.Tensor) -> torch.Tensor:
        """The next chunk of B batch-1 streams in one decoder call: ``latents`` ``[B, latent_dim, t]``, row i for
        ``decoders[i]`` (same VAE and sample-rate condition) -> ``[B, 1, t * decode_hop_length]``, row i equal to
        ``decoders[i].decode_chunk(latents[i:i+1])`` up to float rounding."""
        if len(decoders) == 1:
            return decoders[0].decode_chunk(latents)
        first = decoders[0]
        for dec in decoders:
            dec._check_open()
            if dec._vae is not first._vae or dec._sr_cond != first._sr_cond or dec._batch not in (None, 1):
                raise InputError("decode_many needs batch-1 streams of one VAE with one sample-rate condition")
        z = first._vae.check_latents(latents)
        if z.shape[0] != len(decoders):
            raise InputError(f"need one latent row per stream ({len(decoders)}), got {z.shape[0]}")
        bucket = first._vae.sr_bucket(first._sr_cond, z.shape[0])
        wav = first._vae.decoder(z, bucket, _StackedStreamState([d._state for d in decoders]))
        for dec in decoders:
            dec._batch = 1
            dec._frames += z.shape[2]
        return wav
