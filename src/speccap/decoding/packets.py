"""What crosses the link, as real bytes: the sizes the link model charges are len() of these.

Wire format (version 1), little-endian, each packet = 12-byte header + body:
  header: magic b"SC" | version u8 | kind u8 | session u32 | seq u32
  FEATURES   body: n_mels u16 | frames u32 | dtype u8 (1 = float16) | language u8 | data
  VERIFY     body: bits u8 | n_sync u16 | n_draft u16 | bit-packed token ids (sync then draft)
  VERDICT    body: bits u8 | accepted u16 | has_token u8 | bit-packed token id
  PIPELINED  body: bits u8 | epoch u16 | n_sync u16 | n_draft u16 | has_guess u8 |
             bit-packed token ids (sync, draft, then the guess)
A PIPELINED packet is a VERIFY sent while earlier blocks are still being verified: `epoch` counts
the rejections the edge has heard of (the cloud drops a block whose epoch is behind its own count:
it was drafted on top of a rejected token) and `guess` is the edge's token after the draft, which
the edge went on from, assuming the cloud's bonus token would be the same.
Token ids are packed at ceil(log2 V) bits each. Only features and token ids are ever packed:
no packet type carries waveform samples.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"SC"
VERSION = 1
FEATURES, VERIFY, VERDICT, PIPELINED = 1, 2, 3, 4
_HEADER = struct.Struct("<2sBBII")
_FEATURES = struct.Struct("<HIBB")
_VERIFY = struct.Struct("<BHH")
_VERDICT = struct.Struct("<BHB")
_PIPELINED = struct.Struct("<BHHHB")
LANGUAGES = ("en", "zh")


class PacketError(ValueError):
    pass


def id_bits(vocab_size: int) -> int:
    return max(1, math.ceil(math.log2(vocab_size)))


def pack_ids(ids: list[int], bits: int) -> bytes:
    if not ids:
        return b""
    arr = np.asarray(ids, dtype=np.uint64)
    if int(arr.max()) >= (1 << bits):
        raise PacketError(f"token id {int(arr.max())} does not fit in {bits} bits")
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint64)
    bitmat = ((arr[:, None] >> shifts) & 1).astype(np.uint8)
    return np.packbits(bitmat.reshape(-1)).tobytes()


def unpack_ids(data: bytes, n: int, bits: int) -> list[int]:
    if n == 0:
        return []
    need = math.ceil(n * bits / 8)
    if len(data) < need:
        raise PacketError(f"{n} ids of {bits} bits need {need} bytes, got {len(data)}")
    flat = np.unpackbits(np.frombuffer(data[:need], dtype=np.uint8))[: n * bits].reshape(n, bits)
    weights = (1 << np.arange(bits - 1, -1, -1, dtype=np.uint64))
    return (flat.astype(np.uint64) * weights).sum(axis=1).astype(np.int64).tolist()


def _header(kind: int, session: int, seq: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, kind, session, seq)


def parse_header(data: bytes) -> tuple[int, int, int]:
    if len(data) < _HEADER.size:
        raise PacketError(f"packet of {len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, kind, session, seq = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise PacketError("not a speccap packet (bad magic)")
    if version != VERSION:
        raise PacketError(f"wire format version {version} is not supported (this side speaks {VERSION})")
    return kind, session, seq


def features_packet(session: int, features: np.ndarray, language: str) -> bytes:
    mel = np.ascontiguousarray(features, dtype=np.float16)
    if mel.ndim != 2:
        raise PacketError(f"features must be (n_mels, frames), got shape {mel.shape}")
    return (_header(FEATURES, session, 0) + _FEATURES.pack(mel.shape[0], mel.shape[1], 1, LANGUAGES.index(language))
            + mel.tobytes())


def parse_features(data: bytes) -> tuple[int, np.ndarray, str]:
    kind, session, _ = parse_header(data)
    if kind != FEATURES:
        raise PacketError(f"expected a FEATURES packet, got kind {kind}")
    n_mels, frames, dtype, lang = _FEATURES.unpack_from(data, _HEADER.size)
    body = data[_HEADER.size + _FEATURES.size:]
    if dtype != 1 or lang >= len(LANGUAGES):
        raise PacketError("unknown feature dtype or language code")
    if len(body) != n_mels * frames * 2:
        raise PacketError(f"features body holds {len(body)} bytes, header says {n_mels * frames * 2}")
    return session, np.frombuffer(body, dtype=np.float16).reshape(n_mels, frames), LANGUAGES[lang]


def verify_packet(session: int, seq: int, sync: list[int], draft: list[int], bits: int) -> bytes:
    return (_header(VERIFY, session, seq) + _VERIFY.pack(bits, len(sync), len(draft))
            + pack_ids(list(sync) + list(draft), bits))


def parse_verify(data: bytes) -> tuple[int, int, list[int], list[int]]:
    kind, session, seq = parse_header(data)
    if kind != VERIFY:
        raise PacketError(f"expected a VERIFY packet, got kind {kind}")
    bits, n_sync, n_draft = _VERIFY.unpack_from(data, _HEADER.size)
    ids = unpack_ids(data[_HEADER.size + _VERIFY.size:], n_sync + n_draft, bits)
    return session, seq, ids[:n_sync], ids[n_sync:]


def verdict_packet(session: int, seq: int, accepted: int, token: int | None, bits: int) -> bytes:
    return (_header(VERDICT, session, seq) + _VERDICT.pack(bits, accepted, token is not None)
            + pack_ids([token] if token is not None else [], bits))


def parse_verdict(data: bytes) -> tuple[int, int, int, int | None]:
    kind, session, seq = parse_header(data)
    if kind != VERDICT:
        raise PacketError(f"expected a VERDICT packet, got kind {kind}")
    bits, accepted, has = _VERDICT.unpack_from(data, _HEADER.size)
    ids = unpack_ids(data[_HEADER.size + _VERDICT.size:], 1 if has else 0, bits)
    return session, seq, accepted, (ids[0] if has else None)


def pipelined_packet(session: int, seq: int, epoch: int, sync: list[int], draft: list[int], guess: int | None,
                     bits: int) -> bytes:
    extra = [] if guess is None else [guess]
    return (_header(PIPELINED, session, seq) + _PIPELINED.pack(bits, epoch, len(sync), len(draft), guess is not None)
            + pack_ids(list(sync) + list(draft) + extra, bits))


def parse_pipelined(data: bytes) -> tuple[int, int, int, list[int], list[int], int | None]:
    """(session, seq, epoch, sync, draft, guess) of a PIPELINED packet."""
    kind, session, seq = parse_header(data)
    if kind != PIPELINED:
        raise PacketError(f"expected a PIPELINED packet, got kind {kind}")
    bits, epoch, n_sync, n_draft, has = _PIPELINED.unpack_from(data, _HEADER.size)
    ids = unpack_ids(data[_HEADER.size + _PIPELINED.size:], n_sync + n_draft + int(has), bits)
    return session, seq, epoch, ids[:n_sync], ids[n_sync:n_sync + n_draft], (ids[-1] if has else None)


@dataclass
class Transfer:
    """One packet on the link, for the record."""

    direction: str  # up | down
    kind: str
    nbytes: int
    seconds: float
