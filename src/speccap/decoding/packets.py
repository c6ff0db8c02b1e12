"""What crosses the link, as real bytes: the sizes the link model charges are len() of these.

Wire format (version 1), little-endian, each packet = 12-byte header + body:
  header: magic b"SC" | version u8 | kind u8 | session u32 | seq u32
  FEATURES   body: n_mels u16 | frames u32 | dtype u8 (1 = float16, 2 = float32, 3 = quantised) | language u8 |
             data; quantised (data.uplink.quantise): bits u8 | n_mels x (low f32 | exponent i8) |
             bit-packed codes, row after row
  VERIFY     body: bits u8 | n_sync u16 | n_draft u16 | bit-packed token ids (sync then draft)
  VERDICT    body: bits u8 | accepted u16 | has_token u8 | bit-packed token id
  PIPELINED  body: bits u8 | epoch u16 | n_sync u16 | n_draft u16 | has_guess u8 |
             bit-packed token ids (sync, draft, then the guess)
  OPEN       body: rule u8 (1 = rank, 2 = spec_sampling, 3 = qs, 4 = sq, 5 = wisv) | rank u16 |
             temperature f32 (wisv: its tau) | seed u64 | q dtype u8 (1 = float16, 2 = float32) |
             a whole FEATURES packet
A VERIFY for a rule that needs the draft distributions is followed by them: spec_sampling, n_draft
dense rows of V probabilities in the session's q dtype (V: the shared vocabulary size); qs / sq, the
block's lattice level and each token's sparse lattice point (decoding/qs.py); wisv, the channel state
the edge's modem reports (CSI: uplink Mbps, downlink Mbps, RTT ms, packet error rate, 4 x f32), then,
with the full-hidden protocol, a HIDDEN packet with the state of every draft token (selective: none;
the cloud answers a MISMATCH naming the positions whose states it needs, and the edge sends a
HIDDEN packet with those before the VERDICT comes).
An OPEN packet starts a networked session (speccap.serving): the verification settings the cloud
needs to run the same rule as the in-process loop, then the clip's features.
  HIDDEN     body: n u16 | d u16 | n positions u16 | n x d float16 (edge hidden states, for WISV)
  MISMATCH   body: n u16 | n positions u16 (the cloud asks for the hidden states at these draft positions)
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
import torch

from ..data.uplink import dequantise, quantise

MAGIC = b"SC"
VERSION = 1
FEATURES, VERIFY, VERDICT, PIPELINED, OPEN, HIDDEN, MISMATCH = 1, 2, 3, 4, 5, 6, 7
_HEADER = struct.Struct("<2sBBII")
_FEATURES = struct.Struct("<HIBB")
_VERIFY = struct.Struct("<BHH")
_VERDICT = struct.Struct("<BHB")
_PIPELINED = struct.Struct("<BHHHB")
_OPEN = struct.Struct("<BHfQB")
LANGUAGES = ("en", "zh")
DTYPES = {1: np.float16, 2: np.float32}  # wire code -> numpy dtype
_TORCH_DTYPES = {1: torch.float16, 2: torch.float32}  # the same, as torch casts to them
QUANTISED = 3  # the FEATURES dtype code of quantised values (data.uplink.quantise)
_ROW_LATTICE = np.dtype([("low", "<f4"), ("exponent", "i1")])
RULES = {1: "rank", 2: "spec_sampling", 3: "qs", 4: "sq", 5: "wisv"}
_CSI = struct.Struct("<4f")
# the HTTP header of an OPEN request naming the learned uplink encoder (its digest) the features were
# sent through; a server whose cloud reads a learned one refuses features from another by this name
UPLINK_HEADER = "X-Speccap-Uplink"


class PacketError(ValueError):
    pass


def id_bits(vocab_size: int) -> int:
    return max(1, math.ceil(math.log2(vocab_size)))


def pack_ids(ids: list[int], bits: int) -> bytes:
    """`ids` as `bits`-bit big-endian fields one after another, zero-padded to whole bytes (the
    arithmetic on one Python integer: a round's few ids cost microseconds, not an array's setup)."""
    if not ids:
        return b""
    top = max(ids)
    if top >= (1 << bits) or min(ids) < 0:
        bad = top if top >= (1 << bits) else min(ids)
        raise PacketError(f"token id {bad} does not fit in {bits} bits")
    packed = 0
    for i in ids:
        packed = (packed << bits) | int(i)
    n_bits = bits * len(ids)
    n_bytes = -(-n_bits // 8)
    return (packed << (8 * n_bytes - n_bits)).to_bytes(n_bytes, "big")


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


def dtype_code(name: str) -> int:
    for code, dt in DTYPES.items():
        if np.dtype(dt).name == name:
            return code
    raise PacketError(f"wire dtype must be float16 or float32, got {name!r}")


def features_packet(session: int, features: np.ndarray, language: str, dtype: str = "float16") -> bytes:
    """The clip's features as `dtype`: "float16", "float32", or "q<bits>" for values an uplink of
    that many bits made (data.uplink: each row's codes and lattice; refused when the values are not
    on one, as nothing else would make them)."""
    mel = np.asarray(features)
    if mel.ndim != 2:
        raise PacketError(f"features must be (n_mels, frames), got shape {mel.shape}")
    if language not in LANGUAGES:
        raise PacketError(f"language must be one of {LANGUAGES}, got {language!r}")
    head = _header(FEATURES, session, 0)
    if dtype.startswith("q"):
        bits = int(dtype[1:])
        codes, lows, exponents = quantise(mel, bits)
        if not np.array_equal(dequantise(codes, lows, exponents), mel.astype(np.float32)):
            raise PacketError(f"features are not values of a {bits}-bit uplink (data.uplink.quantise)")
        lattice = np.empty(len(lows), _ROW_LATTICE)
        lattice["low"], lattice["exponent"] = lows, exponents
        return (head + _FEATURES.pack(mel.shape[0], mel.shape[1], QUANTISED, LANGUAGES.index(language))
                + bytes([bits]) + lattice.tobytes() + pack_codes(codes.ravel(), bits))
    code = dtype_code(dtype)
    values = wire_bytes(torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32)), code)
    return head + _FEATURES.pack(mel.shape[0], mel.shape[1], code, LANGUAGES.index(language)) + values


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """uint8 codes below 2^bits as `bits`-bit big-endian fields, zero-padded to whole bytes (the
    layout of `pack_ids`, for whole arrays)."""
    return np.packbits(np.unpackbits(codes.astype(np.uint8)[:, None], axis=1)[:, 8 - bits:]).tobytes()


def unpack_codes(data: bytes, n: int, bits: int) -> np.ndarray:
    need = math.ceil(n * bits / 8)
    if len(data) != need:
        raise PacketError(f"{n} codes of {bits} bits take {need} bytes, got {len(data)}")
    flat = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[: n * bits].reshape(n, bits)
    return np.packbits(np.pad(flat, ((0, 0), (8 - bits, 0))), axis=1)[:, 0]


def parse_features(data: bytes) -> tuple[int, np.ndarray, str]:
    """(session, features, language); quantised values come back as the float32 values they code."""
    return parse_features_bits(data)[:3]


def parse_features_bits(data: bytes) -> tuple[int, np.ndarray, str, int]:
    """`parse_features` and the bits each value was sent at (16: float16, 32: float32)."""
    kind, session, _ = parse_header(data)
    if kind != FEATURES:
        raise PacketError(f"expected a FEATURES packet, got kind {kind}")
    if len(data) < _HEADER.size + _FEATURES.size:
        raise PacketError(f"FEATURES packet of {len(data)} bytes is shorter than its header")
    n_mels, frames, dtype, lang = _FEATURES.unpack_from(data, _HEADER.size)
    body = data[_HEADER.size + _FEATURES.size:]
    if (dtype not in DTYPES and dtype != QUANTISED) or lang >= len(LANGUAGES):
        raise PacketError(f"unknown feature dtype code {dtype} or language code {lang}")
    if dtype == QUANTISED:
        bits = body[0] if body else 0
        if not 2 <= bits <= 8:
            raise PacketError(f"quantised features of {bits} bits are not supported (2 to 8)")
        lattice_end = 1 + n_mels * _ROW_LATTICE.itemsize
        if len(body) < lattice_end:
            raise PacketError(f"quantised features body of {len(body)} bytes does not hold {n_mels} rows' lattices")
        lattice = np.frombuffer(body[1:lattice_end], _ROW_LATTICE)
        codes = unpack_codes(body[lattice_end:], n_mels * frames, bits).reshape(n_mels, frames)
        mel = dequantise(codes, lattice["low"], lattice["exponent"])
    else:
        bits = 8 * np.dtype(DTYPES[dtype]).itemsize
        size = bits // 8
        if len(body) != n_mels * frames * size:
            raise PacketError(f"features body holds {len(body)} bytes, header says {n_mels * frames * size}")
        mel = np.frombuffer(body, dtype=DTYPES[dtype]).reshape(n_mels, frames)
    if not np.isfinite(mel).all():
        raise PacketError("features hold NaN or infinite values")
    return session, mel, LANGUAGES[lang], bits


def verify_packet(session: int, seq: int, sync: list[int], draft: list[int], bits: int) -> bytes:
    return (_header(VERIFY, session, seq) + _VERIFY.pack(bits, len(sync), len(draft))
            + pack_ids(list(sync) + list(draft), bits))


def parse_verify(data: bytes) -> tuple[int, int, list[int], list[int]]:
    kind, session, seq = parse_header(data)
    if kind != VERIFY:
        raise PacketError(f"expected a VERIFY packet, got kind {kind}")
    if len(data) < _HEADER.size + _VERIFY.size:
        raise PacketError(f"VERIFY packet of {len(data)} bytes is shorter than its header")
    bits, n_sync, n_draft = _VERIFY.unpack_from(data, _HEADER.size)
    if not 1 <= bits <= 32:
        raise PacketError(f"token ids of {bits} bits are not supported")
    ids = unpack_ids(data[_HEADER.size + _VERIFY.size:], n_sync + n_draft, bits)
    return session, seq, ids[:n_sync], ids[n_sync:]


def verify_tail(data: bytes) -> bytes:
    """What follows the token ids of a VERIFY packet (the draft distributions, for spec_sampling)."""
    bits, n_sync, n_draft = _VERIFY.unpack_from(data, _HEADER.size)
    return data[_HEADER.size + _VERIFY.size + math.ceil((n_sync + n_draft) * bits / 8):]


def wire_bytes(values: torch.Tensor, code: int) -> bytes:
    """float32 `values` as the wire dtype `code` gives them (DTYPES), in C order. Cast by torch:
    for every finite float32 the same bits as numpy's cast, where numpy's float16 cast of subnormal
    values (most of a peaked draft distribution's, some of a log-mel's) ran up to 70x slower."""
    return values.to(torch.float32).to(_TORCH_DTYPES[code]).contiguous().numpy().tobytes()


def q_payload(q, dtype: str = "float16") -> bytes:
    """The draft distributions as they travel after a VERIFY: one dense row of V per draft token."""
    code = dtype_code(dtype)
    if not len(q):
        return b""
    return wire_bytes(torch.stack([torch.as_tensor(x, dtype=torch.float32) for x in q]), code)


def parse_q(data: bytes, n_draft: int, vocab: int, dtype: str = "float16") -> np.ndarray:
    """(n_draft, vocab) float64 rows from a q payload; an error unless they are distributions."""
    dt = np.dtype(DTYPES[dtype_code(dtype)])
    if len(data) != n_draft * vocab * dt.itemsize:
        raise PacketError(f"draft distributions: {len(data)} bytes, expected {n_draft} x {vocab} {dt.name} "
                          f"= {n_draft * vocab * dt.itemsize}")
    q = np.frombuffer(data, dtype=dt).astype(np.float64).reshape(n_draft, vocab)
    if not np.isfinite(q).all() or (q < 0).any() or (n_draft and np.abs(q.sum(axis=1) - 1).max() > 1e-2):
        raise PacketError("draft distributions must be finite, non-negative and sum to 1")
    return q


def open_packet(features: np.ndarray, language: str, rule: str, rank: int = 1, temperature: float = 1.0,
                seed: int = 0, q_dtype: str = "float16", features_dtype: str = "float16") -> bytes:
    """Start a networked session: the rule's settings and the clip's features (see the module doc)."""
    if rule == "greedy":
        rule, rank = "rank", 1
    codes = {v: k for k, v in RULES.items()}
    if rule not in codes:
        raise PacketError(f"rule {rule!r} cannot be verified over the network (expected greedy, rank, spec_sampling, "
                          "qs, sq or wisv)")
    body = _OPEN.pack(codes[rule], rank, temperature, seed, dtype_code(q_dtype))
    return _header(OPEN, 0, 0) + body + features_packet(0, features, language, features_dtype)


@dataclass
class OpenRequest:
    rule: str
    rank: int
    temperature: float
    seed: int
    q_dtype: str
    features: np.ndarray
    language: str
    features_bits: int = 16  # what each value was sent at (16, 32: floats; fewer: quantised)


def parse_open(data: bytes) -> OpenRequest:
    kind, _, _ = parse_header(data)
    if kind != OPEN:
        raise PacketError(f"expected an OPEN packet, got kind {kind}")
    if len(data) < _HEADER.size + _OPEN.size:
        raise PacketError(f"OPEN packet of {len(data)} bytes is shorter than its header")
    rule, rank, temperature, seed, q_dtype = _OPEN.unpack_from(data, _HEADER.size)
    if rule not in RULES or q_dtype not in DTYPES:
        raise PacketError(f"unknown rule code {rule} or q dtype code {q_dtype}")
    if rank < 1 or not math.isfinite(temperature) or (RULES[rule] not in ("rank", "wisv") and temperature <= 0) \
            or (RULES[rule] == "wisv" and not 0 <= temperature <= 1):
        raise PacketError(f"bad rule settings: rank {rank}, temperature {temperature}")
    _, mel, language, bits = parse_features_bits(data[_HEADER.size + _OPEN.size:])
    return OpenRequest(RULES[rule], rank, temperature, seed, np.dtype(DTYPES[q_dtype]).name, mel, language, bits)


def csi_payload(uplink_mbps: float, downlink_mbps: float, rtt_ms: float, per: float) -> bytes:
    """WISV's channel state after a VERIFY's token ids (see the module doc)."""
    return _CSI.pack(uplink_mbps, downlink_mbps, rtt_ms, per)


def parse_csi(tail: bytes) -> tuple[tuple[float, float, float, float], bytes]:
    """(uplink Mbps, downlink Mbps, RTT ms, packet error rate) and what follows them (a HIDDEN packet or nothing)."""
    if len(tail) < _CSI.size:
        raise PacketError(f"a wisv VERIFY needs the channel state ({_CSI.size} bytes) after the token ids, "
                          f"got {len(tail)} bytes")
    return _CSI.unpack_from(tail), tail[_CSI.size:]


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


def hidden_packet(session: int, seq: int, positions: list[int], hidden: np.ndarray) -> bytes:
    """Edge hidden states (n, d) at draft `positions`, float16."""
    h = np.ascontiguousarray(hidden, dtype=np.float32)
    if h.ndim != 2 or h.shape[0] != len(positions):
        raise PacketError(f"hidden states must be (len(positions), d), got {h.shape} for {len(positions)} positions")
    return (_header(HIDDEN, session, seq) + struct.pack("<HH", h.shape[0], h.shape[1])
            + np.asarray(positions, dtype="<u2").tobytes() + wire_bytes(torch.from_numpy(h), 1))


def parse_hidden(data: bytes) -> tuple[int, int, list[int], np.ndarray]:
    kind, session, seq = parse_header(data)
    if kind != HIDDEN:
        raise PacketError(f"expected a HIDDEN packet, got kind {kind}")
    n, d = struct.unpack_from("<HH", data, _HEADER.size)
    start = _HEADER.size + 4
    if len(data) != start + 2 * n + 2 * n * d:
        raise PacketError(f"HIDDEN packet of {len(data)} bytes does not hold {n} x {d} float16 states")
    pos = np.frombuffer(data, dtype="<u2", count=n, offset=start).tolist()
    h = np.frombuffer(data, dtype=np.float16, offset=start + 2 * n).reshape(n, d)
    return session, seq, pos, h


def mismatch_packet(session: int, seq: int, positions: list[int]) -> bytes:
    return _header(MISMATCH, session, seq) + struct.pack("<H", len(positions)) + np.asarray(
        positions, dtype="<u2").tobytes()


def parse_mismatch(data: bytes) -> tuple[int, int, list[int]]:
    kind, session, seq = parse_header(data)
    if kind != MISMATCH:
        raise PacketError(f"expected a MISMATCH packet, got kind {kind}")
    (n,) = struct.unpack_from("<H", data, _HEADER.size)
    if len(data) != _HEADER.size + 2 + 2 * n:
        raise PacketError(f"MISMATCH packet of {len(data)} bytes does not hold {n} positions")
    return session, seq, np.frombuffer(data, dtype="<u2", count=n, offset=_HEADER.size + 2).tolist()


@dataclass
class Transfer:
    """One packet on the link, for the record."""

    direction: str  # up | down
    kind: str
    nbytes: int
    seconds: float
