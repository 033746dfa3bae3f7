"""The mark's payload: 32 bits, sent with a CRC-16 so that a detector can tell a payload it read right from noise.

The payload itself is whatever the caller wants to prove later; ``payload_hash`` makes one from strings (e.g. the
model id and the request id). Bit order: most significant first, payload then CRC.
"""

from __future__ import annotations

import hashlib

import numpy as np

PAYLOAD_BITS = 32
CRC_BITS = 16
CODED_BITS = PAYLOAD_BITS + CRC_BITS


def crc16(value: int) -> int:
    """CRC-16/CCITT-FALSE of a 32-bit value's 4 big-endian bytes."""
    crc = 0xFFFF
    for byte in value.to_bytes(4, "big"):
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def check_payload(payload: int) -> int:
    """``payload`` as an int in [0, 2**32); anything else is a ``ValueError`` (``bool`` too)."""
    if isinstance(payload, bool) or not isinstance(payload, (int, np.integer)):
        raise ValueError(f"payload must be an int in [0, 2**32), got {type(payload).__name__}")
    if not 0 <= int(payload) < 2**PAYLOAD_BITS:
        raise ValueError(f"payload must be an int in [0, 2**32), got {payload}")
    return int(payload)


def encode(payload: int) -> np.ndarray:
    """payload -> coded bits as signs, float64 ``[CODED_BITS]`` of +1 (bit 1) / -1 (bit 0)."""
    word = (check_payload(payload) << CRC_BITS) | crc16(payload)
    bits = (word >> np.arange(CODED_BITS - 1, -1, -1)) & 1
    return 2.0 * bits - 1.0


def decode(soft: np.ndarray) -> tuple[int, bool]:
    """Soft coded bits ``[CODED_BITS]`` (positive: 1) -> (payload read by hard decision, whether its CRC matches)."""
    word = 0
    for value in soft:
        word = (word << 1) | int(value > 0)
    payload, crc = word >> CRC_BITS, word & 0xFFFF
    return payload, crc16(payload) == crc


# Bits ``decode_least_reliable`` may flip: the 3 least reliable, one or two at a time (6 words besides the hard
# decision), so a word with its errors elsewhere passes the CRC by chance about 7 in 65,536 times.
FLIP_CANDIDATES = 3


def decode_least_reliable(soft: np.ndarray) -> tuple[int, bool]:
    """``decode``, then, if the CRC fails, the words with one or two of the ``FLIP_CANDIDATES`` least reliable bits
    (smallest ``|soft|``) flipped, the least reliable flips first: the first whose CRC matches, else the hard
    decision. For a mark already found by its pilot: there one weak bit (a data cell in a band the audio barely
    fills) is what most often breaks the CRC (about 1 key in 60-200 on a 2 s speech-like clip)."""
    raw, ok = decode(soft)
    if ok:
        return raw, ok
    weakest = np.argsort(np.abs(soft))[:FLIP_CANDIDATES]
    flips = [(int(i),) for i in weakest] + [(int(i), int(j)) for k, i in enumerate(weakest) for j in weakest[k + 1:]]
    flips.sort(key=lambda bits: float(np.abs(soft[list(bits)]).sum()))
    for bits in flips:
        trial = np.array(soft, dtype=np.float64)
        trial[list(bits)] *= -1
        value, crc_ok = decode(trial)
        if crc_ok:
            return value, True
    return raw, False


def payload_hash(*parts: str) -> int:
    """A 32-bit payload from strings, e.g. ``payload_hash(model_id, request_id)`` (BLAKE2b, first 4 bytes)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode("utf-8"), digest_size=4).digest()
    return int.from_bytes(digest, "big")
