"""The built-in compressors against numbers worked out by hand: payload sizes, values read
back, FLOPs charged, and the wrapper that applies one to a client's upload."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from mecsim.agents.algorithms.base import ClientResult
from mecsim.agents.compressors import (
    CompressionError,
    Quantize,
    RandomMask,
    TopK,
    compress_upload,
)
from mecsim.emulation.ops import Compute, Download, ServerCompute, Upload


def test_quantize_8bit_bytes_and_values_by_hand():
    # 1000 values in blocks of 256: 4 blocks (lo, step: 8 bytes each), one byte a value,
    # an 8-byte header: 8 + 32 + 1000
    q = Quantize({"bits": 8, "block_size": 256, "rounding": "nearest"})
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    payload = q.encode(x, seed=0)
    assert len(payload) == 8 + 4 * 8 + 1000 == 1040 == q.encoded_nbytes(1000)
    assert struct.unpack_from("<IHBB", payload) == (1000, 256, 8, 1)
    # block 0 holds x[0..255]: lo = -1, step = (x[255] + 1) / 255 = (510 / 999) / 255
    lo, step = struct.unpack_from("<ff", payload, 8)
    assert lo == -1.0
    assert step == pytest.approx(2 / 999, rel=1e-6)
    back = q.decode(payload)
    assert back.dtype == np.float32 and back.shape == (1000,)
    # nearest rounding: within half a step (the linspace is on the grid: exact to float32)
    assert np.max(np.abs(back - x)) <= step / 2 + 1e-6


def test_quantize_4bit_packs_two_codes_a_byte():
    # 5 values, one block: 8 header + 8 (lo, step) + ceil(5 * 4 / 8) = 3 bytes of codes
    q = Quantize({"bits": 4, "block_size": 0, "rounding": "nearest"})
    x = np.array([0.0, 1.0, 2.0, 15.0, 7.0], np.float32)  # lo 0, step 15 / 15 = 1
    payload = q.encode(x, seed=0)
    assert len(payload) == 8 + 8 + 3 == 19 == q.encoded_nbytes(5)
    assert struct.unpack_from("<ff", payload, 8) == (0.0, 1.0)
    # codes 0, 1, 2, 15, 7: bytes 0x10 (1 << 4 | 0), 0xF2, 0x07 (the last nibble pad 0)
    assert payload[16:] == bytes([0x10, 0xF2, 0x07])
    np.testing.assert_array_equal(q.decode(payload), x)


def test_quantize_stochastic_is_unbiased_and_seeded():
    q = Quantize({"bits": 4})
    x = np.full(20000, 0.3, np.float32)
    x[0], x[1] = 0.0, 1.0  # lo 0, step 1/15: 0.3 = 4.5 steps -> codes 4 or 5, half each
    a, b = q.encode(x, seed=7), q.encode(x, seed=7)
    assert a == b and a != q.encode(x, seed=8)
    back = q.decode(a)
    assert set(np.round(back[2:] * 15).astype(int)) == {4, 5}
    assert abs(float(back[2:].mean()) - 0.3) < 0.005
    assert np.max(np.abs(back - x)) <= q.error_bound(x)


def test_topk_bytes_positions_and_values():
    # n = 1000, fraction 0.01: k = 10; 8 header + 10 uint32 positions + 10 float32 = 88
    t = TopK({"fraction": 0.01})
    x = np.zeros(1000, np.float32)
    big = [3, 100, 250, 251, 400, 555, 600, 777, 900, 999]
    x[big] = np.arange(1, 11, dtype=np.float32) * np.array([1, -1] * 5)
    x[50] = 0.5  # the 11th largest: left out
    payload = t.encode(x, seed=0)
    assert len(payload) == 88 == t.encoded_nbytes(1000)
    assert struct.unpack_from("<II", payload) == (1000, 10)
    assert list(np.frombuffer(payload, "<u4", 10, 8)) == big
    back = t.decode(payload)
    expected = x.copy()
    expected[50] = 0
    np.testing.assert_array_equal(back, expected)
    assert np.linalg.norm(back - x) == pytest.approx(0.5)
    assert np.linalg.norm(back - x) <= t.error_bound(x)
    # k = round(0.01 * 1000) = 10: |x| and selection 2n, the gather k; the scatter k
    assert t.encode_flops(1000) == 2010 and t.decode_flops(1000) == 10


def test_topk_k_is_at_least_one_and_at_most_n():
    assert TopK({"fraction": 0.001}).k(10) == 1
    assert TopK({"fraction": 1.0}).k(10) == 10
    x = np.arange(10, dtype=np.float32)
    full = TopK({"fraction": 1.0})
    np.testing.assert_array_equal(full.decode(full.encode(x, 0)), x)
    assert len(full.encode(x, 0)) == 8 + 8 * 10


def test_random_mask_sends_values_and_the_seed_not_positions():
    # n = 1000, fraction 0.1: k = 100; a 16-byte header (n, k, seed) + 100 float32 = 416
    m = RandomMask({"fraction": 0.1, "rescale": False})
    x = np.arange(1, 1001, dtype=np.float32)  # no zero: the positions kept are the non-zeros
    payload = m.encode(x, seed=12345)
    assert len(payload) == 416 == m.encoded_nbytes(1000)
    assert struct.unpack_from("<IIQ", payload) == (1000, 100, 12345)
    back = m.decode(payload)
    kept = np.flatnonzero(back)
    np.testing.assert_array_equal(kept, RandomMask.positions(1000, 100, 12345))
    assert len(kept) == 100
    np.testing.assert_array_equal(back[kept], x[kept])
    assert m.encode(x, seed=12345) == payload and m.encode(x, seed=1) != payload
    scaled = RandomMask({"fraction": 0.1}).decode(RandomMask({"fraction": 0.1}).encode(x, 5))
    pos = RandomMask.positions(1000, 100, 5)
    np.testing.assert_allclose(scaled[pos], x[pos] * 10, rtol=1e-6)


def _result(weights, trace):
    return ClientResult(
        client_id=3,
        weights=weights,
        upload_nbytes=weights.nbytes,
        num_samples=10,
        train_loss=0.1,
        trace=trace,
        flops=1000.0,
        steps=2,
        peak_memory_bytes=0,
    )


def test_compress_upload_charges_the_payload_and_both_sides_flops():
    n = 1000
    ref = np.ones(n, np.float32)
    trained = ref.copy()
    trained[[10, 20]] = [3.0, -1.0]  # an update of +2 and -2 at two places, 0 elsewhere
    trace = (Download(4 * n), Compute(1000.0, 2), Upload(4 * n))
    t = TopK({"fraction": 0.002, "error_feedback": True})  # k = 2
    result, residual = compress_upload(
        t, "topk", "fedavg", 0, ref, _result(trained, trace), None, 1
    )
    assert result.upload_nbytes == 8 + 8 * 2 == 24
    # the device: the update (n), |x| and selection (2n) and the gather (k), then error
    # feedback's decoding (k) and residual (n): 4n + 2k; the server: decoding k, then n
    assert result.trace == (
        Download(4 * n),
        Compute(1000.0, 2),
        Compute(4 * n + 2 * 2, 0, "encode"),
        Upload(24),
        ServerCompute(n + 2, 0, "decode"),
    )
    assert result.flops == 1000.0 + 4 * n + 4
    np.testing.assert_array_equal(result.weights, trained)  # the two values were the top 2
    np.testing.assert_array_equal(residual, np.zeros(n, np.float32))


def test_error_feedback_sends_what_was_left_out_next_time():
    n = 100
    ref = np.zeros(n, np.float32)
    t = TopK({"fraction": 0.01})  # k = 1
    first = np.zeros(n, np.float32)
    first[[5, 6]] = [2.0, 1.0]
    trace = (Compute(1.0, 1), Upload(4 * n))
    got, residual = compress_upload(t, "topk", "fedavg", 0, ref, _result(first, trace), None, 1)
    assert got.weights[5] == 2.0 and got.weights[6] == 0.0 and residual[6] == 1.0
    # next round the update is 0 everywhere: the residual alone goes up
    again, residual = compress_upload(
        t, "topk", "fedavg", 1, ref, _result(np.zeros(n, np.float32), trace), residual, 1
    )
    assert again.weights[6] == 1.0 and not residual.any()
    # with a residual the device also adds it: n more FLOPs
    assert again.trace[1] == Compute(n + 2 * n + 1 + 1 + n + n, 0, "encode")


def test_compress_upload_refuses_a_partial_upload():
    n = 10
    w = np.ones(n, np.float32)
    with pytest.raises(CompressionError, match="one Upload of 40 bytes"):
        compress_upload(TopK(), "topk", "myfl", 0, w, _result(w, (Upload(20), Upload(20))), None, 1)
    with pytest.raises(CompressionError, match="downloaded nothing"):
        compress_upload(TopK(), "topk", "myfl", 0, None, _result(w, (Upload(40),)), None, 1)
