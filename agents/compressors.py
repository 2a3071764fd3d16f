"""Compressors: what a client's upload becomes on the air, and what the server reads back.

A compressor (an entry of the ``mecsim.compressors`` group, named by a scenario's
``compressor: {name: NAME, params: {...}}``) turns a flat float32 vector into bytes and
back. mecsim applies it to each upload of an algorithm whose clients upload the whole
flat model (:attr:`ClientAlgorithm.compressible_uploads`): the client encodes its
**update**, the difference between the model it trained and the one it downloaded
(``result.weights - task.weights``), and the server aggregates the model it decodes,
``task.weights + decode(payload)``. A lossy compressor therefore changes what is
learned, as it would on a real network. What is charged (:func:`compress_upload`):

* the upload: ``len(payload)`` bytes, headers included, nothing else;
* the client's device: the update's subtraction, the encoding and, with error feedback,
  the residual's addition, a decoding and the residual's update (``Compute(..., 0,
  "encode")`` before the upload);
* the server: the decoding and the addition of the reference (``ServerCompute(..., 0,
  "decode")`` after the upload, on the client's edge server's CPU).

Error feedback (:attr:`Compressor.keeps_residual`): what the encoding lost this round is
added to the next round's update (Seide et al., 2014; Karimireddy et al., 2019). The
residual is the client's own state: kept by its host, checkpointed with the client's
state and restored on resume, put back when the client's work is lost (a crash), and it
pins the client to its host (no lending to even out the hosts' work).

The built-ins' wire formats are little-endian and stated in each class; their sizes are
worked out by hand in ``tests/unit/agents/test_compressors.py``.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import mecsim.registry as registry
from mecsim.agents.algorithms.base import AlgorithmError, ClientResult
from mecsim.emulation.ops import Compute, ServerCompute, Upload


class CompressorParams(BaseModel):
    """The base of a compressor's ``Params`` (``compressor.params`` in a scenario)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Compressor(ABC):
    """Encode a flat float32 vector into bytes (:meth:`encode`) and back (:meth:`decode`).

    A compressor states what it costs and how wrong it may be: :meth:`encode_flops` and
    :meth:`decode_flops` (charged to the device and the server), :meth:`error_bound`
    (``norm(decode(encode(x)) - x)`` at most, in :attr:`error_norm`), and, when it does
    not depend on the data, :meth:`encoded_nbytes`. :meth:`decode` reads nothing but the
    payload (and the compressor's own ``params``): everything the server needs travels,
    and is charged. Randomness comes only from ``seed``; the conformance kit
    (:func:`mecsim.testing.check_compressor`) checks all of this."""

    Params: ClassVar[type[BaseModel]] = CompressorParams
    #: the norm :meth:`error_bound` bounds: ``"l2"`` or ``"linf"``
    error_norm: ClassVar[str] = "l2"

    def __init__(self, params: dict | None = None) -> None:
        self.params = self.Params(**(params or {}))

    @property
    def keeps_residual(self) -> bool:
        """Error feedback: the host keeps each client's residual (what encoding lost) and
        adds it to the next update. ``params.error_feedback`` when the Params has it."""
        return bool(getattr(self.params, "error_feedback", False))

    @abstractmethod
    def encode(self, x: np.ndarray, seed: int) -> bytes:
        """The payload for the 1-D float32 ``x``, headers included; ``seed`` (from the
        scenario seed, round and client) is the only randomness it may use."""

    @abstractmethod
    def decode(self, payload: bytes) -> np.ndarray:
        """The 1-D float32 vector ``payload`` encodes."""

    @abstractmethod
    def encode_flops(self, n: int) -> float:
        """Floating-point (and comparison) operations of :meth:`encode` of ``n`` values."""

    @abstractmethod
    def decode_flops(self, n: int) -> float:
        """Operations of :meth:`decode` of a payload of ``n`` values."""

    @abstractmethod
    def error_bound(self, x: np.ndarray) -> float:
        """The most ``norm(decode(encode(x, seed)) - x)`` may be, for any seed."""

    def encoded_nbytes(self, n: int) -> int | None:
        """``len(encode(x))`` for any ``x`` of ``n`` values, or None when it depends on
        the values."""
        return None


def _float32_slack(x: np.ndarray) -> float:
    """Rounding of float32 arithmetic on values of ``x``'s magnitude (a few ulps)."""
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    return 8.0 * float(np.finfo(np.float32).eps) * scale + 1e-30


class QuantizeParams(CompressorParams):
    bits: Literal[4, 8] = Field(8, description="bits per value: 8 or 4")
    block_size: int = Field(
        1024,
        ge=0,
        le=65535,
        description="values sharing one offset and scale (a block's min and step); 0: one "
        "block for the whole vector",
    )
    rounding: Literal["stochastic", "nearest"] = Field(
        "stochastic",
        description="stochastic: round up with probability equal to the remainder "
        "(unbiased, QSGD); nearest: to the nearest level",
    )


class Quantize(Compressor):
    """Uniform quantisation to ``bits`` (8 or 4) per value with a scale per block.

    Each block of ``block_size`` values is sent as its minimum ``lo`` and its step
    ``(max - lo) / (2^bits - 1)`` (two float32) and one code per value, ``lo + code *
    step`` being the value read back; 4-bit codes are packed two a byte, the first in the
    low nibble. Payload: an 8-byte header (``<IHBB``: n, block size, bits, rounding 0
    stochastic / 1 nearest), 8 bytes per block, then ``ceil(n * bits / 8)`` bytes of codes:
    ``8 + 8 * ceil(n / block) + ceil(n * bits / 8)``. Error (per value): below one step
    (stochastic rounding), at most half a step (nearest), plus float32 rounding.
    """

    Params = QuantizeParams
    error_norm = "linf"
    params: QuantizeParams

    def _block(self, n: int) -> int:
        return self.params.block_size or max(n, 1)

    def encoded_nbytes(self, n: int) -> int:
        blocks = math.ceil(n / self._block(n))
        return 8 + 8 * blocks + math.ceil(n * self.params.bits / 8)

    def encode(self, x: np.ndarray, seed: int) -> bytes:
        p = self.params
        n = int(x.size)
        block = self._block(n)
        levels = (1 << p.bits) - 1
        blocks = math.ceil(n / block)
        pad = blocks * block - n
        xb = np.concatenate([x.astype(np.float32), np.repeat(x[-1:], pad)]) if pad and n else x
        xb = np.asarray(xb, dtype=np.float32).reshape(blocks, block) if n else xb
        lo = xb.min(axis=1) if n else np.zeros(0, np.float32)
        hi = xb.max(axis=1) if n else np.zeros(0, np.float32)
        step = ((hi.astype(np.float64) - lo) / levels).astype(np.float32)
        safe = np.where(step > 0, step, np.float32(1.0)).astype(np.float32)
        scaled = (xb - lo[:, None]) / safe[:, None] if n else xb
        if p.rounding == "stochastic":
            u = np.random.default_rng(seed).random(scaled.shape, dtype=np.float32)
            codes = np.floor(scaled + u)
        else:
            codes = np.floor(scaled + np.float32(0.5))
        codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(-1)[:n]
        codes[np.repeat(step, block)[:n] == 0] = 0
        if p.bits == 4:
            if n % 2:
                codes = np.append(codes, np.uint8(0))
            codes = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
        header = struct.pack("<IHBB", n, p.block_size, p.bits, p.rounding == "nearest")
        scales = np.stack([lo, step], axis=1).astype("<f4").tobytes()
        return header + scales + codes.tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        n, block_size, bits, _ = struct.unpack_from("<IHBB", payload)
        block = block_size or max(n, 1)
        blocks = math.ceil(n / block)
        scales = np.frombuffer(payload, "<f4", 2 * blocks, 8).reshape(blocks, 2)
        raw = np.frombuffer(payload, np.uint8, offset=8 + 8 * blocks)
        if bits == 4:
            codes = np.empty(2 * raw.size, np.uint8)
            codes[0::2], codes[1::2] = raw & 0x0F, raw >> 4
        else:
            codes = raw
        codes = codes[:n].astype(np.float32)
        lo = np.repeat(scales[:, 0], block)[:n]
        step = np.repeat(scales[:, 1], block)[:n]
        return (lo + codes * step).astype(np.float32)

    def encode_flops(self, n: int) -> float:
        # the block's min and max (2n comparisons), (x - lo) / step, the rounding's add
        # and floor, the clip: 6 a value (and the stochastic draw, not counted)
        return 6.0 * n

    def decode_flops(self, n: int) -> float:
        return 2.0 * n  # lo + code * step

    def error_bound(self, x: np.ndarray) -> float:
        n = int(x.size)
        if n == 0:
            return 0.0
        block = self._block(n)
        blocks = math.ceil(n / block)
        pad = blocks * block - n
        xb = np.concatenate([x, np.repeat(x[-1:], pad)]).reshape(blocks, block)
        span = xb.max(axis=1).astype(np.float64) - xb.min(axis=1)
        step = float(span.max()) / ((1 << self.params.bits) - 1)
        share = 1.0 if self.params.rounding == "stochastic" else 0.5
        return share * step * (1 + 1e-6) + _float32_slack(x)


def _count(fraction: float, n: int) -> int:
    """``fraction * n`` rounded to the nearest integer, at least 1 (of n >= 1)."""
    return 0 if n == 0 else min(n, max(1, round(fraction * n)))


class TopKParams(CompressorParams):
    fraction: float = Field(
        0.01, gt=0, le=1, description="the share of values sent (k = round(fraction n), >= 1)"
    )
    error_feedback: bool = Field(
        True, description="add what the last encoding left out to the next update"
    )


class TopK(Compressor):
    """The ``k`` values of largest magnitude, with their positions (``k = round(fraction
    n)``, at least 1; ties: as ``numpy.argpartition`` leaves them, the same every time).

    Payload: an 8-byte header (``<II``: n, k), the k positions (uint32, ascending), the k
    values (float32): ``8 + 8 k`` bytes. Error (L2): the values left out, at most
    ``sqrt(1 - k / n)`` of ``||x||`` (the k largest hold at least k/n of its energy).
    """

    Params = TopKParams
    params: TopKParams

    def k(self, n: int) -> int:
        return _count(self.params.fraction, n)

    def encoded_nbytes(self, n: int) -> int:
        return 8 + 8 * self.k(n)

    def encode(self, x: np.ndarray, seed: int) -> bytes:
        n = int(x.size)
        k = self.k(n)
        if k == n:
            idx = np.arange(n, dtype=np.uint32)
        else:
            idx = np.sort(np.argpartition(-np.abs(x), k - 1)[:k]).astype(np.uint32)
        values = x[idx].astype("<f4")
        return struct.pack("<II", n, k) + idx.astype("<u4").tobytes() + values.tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        n, k = struct.unpack_from("<II", payload)
        idx = np.frombuffer(payload, "<u4", k, 8)
        values = np.frombuffer(payload, "<f4", k, 8 + 4 * k)
        out = np.zeros(n, np.float32)
        out[idx] = values
        return out

    def encode_flops(self, n: int) -> float:
        # |x| and the selection (argpartition: linear on average, ~n comparisons), the
        # gather of k values
        return 2.0 * n + self.k(n)

    def decode_flops(self, n: int) -> float:
        return float(self.k(n))  # the scatter

    def error_bound(self, x: np.ndarray) -> float:
        n = int(x.size)
        if n == 0:
            return 0.0
        norm = float(np.linalg.norm(x.astype(np.float64)))
        return math.sqrt(max(0.0, 1 - self.k(n) / n)) * norm * (1 + 1e-6) + 1e-30


class RandomMaskParams(CompressorParams):
    fraction: float = Field(
        0.1, gt=0, le=1, description="the share of values sent (k = round(fraction n), >= 1)"
    )
    rescale: bool = Field(
        True, description="scale the values sent by n / k (an unbiased estimate of x)"
    )
    error_feedback: bool = Field(
        False, description="add what the last encoding left out to the next update"
    )


class RandomMask(Compressor):
    """``k`` values at positions drawn from ``seed`` (uniformly, without replacement): the
    positions are not sent, the server draws them again from the seed in the header.

    Payload: a 16-byte header (``<IIQ``: n, k, seed), the k values (float32, at the
    positions in ascending order, times ``n / k`` with ``rescale``): ``16 + 4 k`` bytes.
    Error (L2): at most ``max(n / k - 1, 1) ||x||`` with ``rescale``, ``||x||`` without.
    """

    Params = RandomMaskParams
    params: RandomMaskParams

    def k(self, n: int) -> int:
        return _count(self.params.fraction, n)

    def encoded_nbytes(self, n: int) -> int:
        return 16 + 4 * self.k(n)

    @staticmethod
    def positions(n: int, k: int, seed: int) -> np.ndarray:
        """The k positions ``seed`` draws among n, ascending."""
        return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))

    def encode(self, x: np.ndarray, seed: int) -> bytes:
        n = int(x.size)
        k = self.k(n)
        seed = int(seed) & (2**64 - 1)
        values = x[self.positions(n, k, seed)].astype(np.float32) if k else x[:0]
        if self.params.rescale and k:
            values = values * np.float32(n / k)
        return struct.pack("<IIQ", n, k, seed) + values.astype("<f4").tobytes()

    def decode(self, payload: bytes) -> np.ndarray:
        n, k, seed = struct.unpack_from("<IIQ", payload)
        out = np.zeros(n, np.float32)
        if k:
            out[self.positions(n, k, seed)] = np.frombuffer(payload, "<f4", k, 16)
        return out

    def encode_flops(self, n: int) -> float:
        return 3.0 * self.k(n)  # the draw, the gather and the rescaling of k values

    def decode_flops(self, n: int) -> float:
        return 2.0 * self.k(n)  # the draw again, the scatter

    def error_bound(self, x: np.ndarray) -> float:
        n = int(x.size)
        if n == 0:
            return 0.0
        norm = float(np.linalg.norm(x.astype(np.float64)))
        factor = max(n / self.k(n) - 1, 1.0) if self.params.rescale else 1.0
        return factor * norm * (1 + 1e-6) + _float32_slack(x) * math.sqrt(n)


#: The key of a client's error-feedback residual in its checkpointed state (beside the
#: algorithm's own ``ctx.state``, which never sees it)
RESIDUAL_KEY = "mecsim:compressor_residual"


class CompressionError(AlgorithmError):
    """An upload the compressor cannot be applied to, or a compressor that broke its
    contract: one line naming the compressor, the algorithm and the client."""


def compressor(name: str, params: dict | None = None) -> Compressor:
    """The compressor ``name`` (the ``mecsim.compressors`` registry) built with ``params``."""
    cls = registry.COMPRESSORS.get(name)
    built: Compressor = cls(dict(params or {}))
    return built


def compress_upload(
    comp: Compressor,
    name: str,
    algorithm: str,
    rnd: int,
    reference: np.ndarray | None,
    result: ClientResult,
    residual: np.ndarray | None,
    seed: int,
) -> tuple[ClientResult, np.ndarray | None]:
    """``result`` as the compressor ``comp`` (named ``name``) sends it: its weights
    replaced by what the server decodes (``reference + decode(encode(update))``), its
    upload charged the payload's length, the encoding's FLOPs charged to the device
    before the upload and the decoding's to the server after it. Returns the result and
    the client's new residual (error feedback; else None). ``reference`` is what the
    client downloaded (``task.weights``)."""
    w = result.weights
    if w is None:
        return result, residual
    cid = result.client_id
    where = f"compressor {name!r} with algorithm {algorithm!r}: client {cid} in round {rnd + 1}"
    if reference is None or reference.shape != w.shape:
        got = "nothing" if reference is None else f"{reference.size} values"
        raise CompressionError(
            f"{where} uploaded {w.size} values but downloaded {got}: a compressor encodes "
            "the update against the downloaded model, of the same size"
        )
    ups = [(i, op) for i, op in enumerate(result.trace) if isinstance(op, Upload)]
    if len(ups) != 1 or ups[0][1].nbytes != w.nbytes:
        raise CompressionError(
            f"{where}: its op-trace does not send its upload as one Upload of "
            f"{w.nbytes} bytes (the whole flat vector), so it cannot be compressed"
        )
    n = int(w.size)
    update = w.astype(np.float32) - reference.astype(np.float32)
    if residual is not None:
        update = update + residual
    payload = comp.encode(update, seed)
    if not isinstance(payload, bytes):
        raise CompressionError(f"{where}: encode returned {type(payload).__name__}, not bytes")
    decoded = comp.decode(payload)
    if not (
        isinstance(decoded, np.ndarray) and decoded.shape == (n,) and decoded.dtype == np.float32
    ):
        raise CompressionError(
            f"{where}: decode did not return the {n} float32 values it was given"
        )
    flops = n + comp.encode_flops(n)  # the update, then its encoding
    new_residual = None
    if comp.keeps_residual:
        # the residual added (if any), the client's own decoding, what it left out
        flops += (n if residual is not None else 0) + comp.decode_flops(n) + n
        new_residual = (update - decoded).astype(np.float32)
    server = comp.decode_flops(n) + n  # the decoding, then the reference added
    i, sent = ups[0]
    trace = (
        *result.trace[:i],
        Compute(float(flops), 0, "encode"),
        Upload(len(payload), sent.what),
        ServerCompute(float(server), 0, "decode"),
        *result.trace[i + 1 :],
    )
    result.trace = trace
    result.upload_nbytes = len(payload)
    result.flops = result.flops + float(flops)
    result.weights = (reference.astype(np.float32) + decoded).astype(np.float32)
    return result, new_residual
