"""Symmetric int4 and int8 weights of a MatMul, per output channel or (int4) block-wise in the form the QNN EP runs
as LPBQ, with an optional scale search against the activations the float model feeds the matrix.

A MatMul weight W is [K, N] (input features x output channels). Per channel: one scale per output channel, as
onnxruntime's quantizer writes it. Block-wise: one scale per block of `block_size` input rows and output channel,
written as an ONNX DequantizeLinear with `block_size` (opset 21). The QNN EP (onnxruntime-qnn 2.7.0, provider option
`enable_block_quant_weight_optimization=1`) turns such scales into LPBQ: a float scale per channel (the channel's
largest block scale / 16) times a 4-bit integer per block (round(block scale / channel scale), 1..16). Scales that
are not already on that grid are rounded by the EP, so the CPU's QDQ graph and the HTP would compute different
weights (measured: simulator vs CPU cosine 0.9990 instead of 0.99998 on a 1024x1024 MatMul); every block scale
written here is a channel scale times an integer 1..16 with 16 in each channel, which the EP keeps as is.

Scale search (sequential MSE in AIMET's terms, here on the float model's activations): for each output channel the
clipping ratio of its range (RATIOS) that minimizes the matrix's output error ||X (W - Q(W))||^2 over the calibration
rows X, plus its diagonal part (_column_errors: short calibrations have fewer rows than features); block-wise, then
each block's integer (within BLOCK_STEPS of its min/max value) by the block's own share of that error (the cross
terms between blocks of a channel are left out)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QMAX = {4: 7, 8: 127}  # symmetric (zero point 0): int4 -8..7, int8 -128..127; ranges scale to QMAX
LPBQ_LEVELS = 16  # the EP's per-block integer scales: 1..16 times the channel's scale
BLOCK_SIZES = (16, 32, 64, 128, 256)  # powers of two the EP ran (docs/llm.md); 48 gave wrong outputs on v75
# block size -> blocks per channel the HTP simulator failed on (onnxruntime-qnn 2.7.0, one MatMul, v75 and the other
# arches tried; docs/llm.md): 16 gave wrong outputs, 64 and up crashed (SIGSEGV). 32 ran at every count tried.
FAILED_BLOCKS = {16: (7, 9, 13), 64: (7, 8, 9, 13), 128: (8,), 256: (8,)}
FAILED_HOW = {16: "gave wrong outputs (cosine ~0.8 against the CPU)", 64: "crashed (SIGSEGV)", 128: "crashed (SIGSEGV)",
              256: "crashed (SIGSEGV)"}
RATIOS = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0 .. 0.5 of the channel's range
BLOCK_STEPS = (-2, -1, 1)  # a block's integer tried around its min/max value
ROW_CHUNK = 1024  # output channels per error evaluation (bounds the [T, chunk] intermediate)
TINY = 1e-12  # floor of a scale: an all-zero channel quantizes to zeros


@dataclass
class Int4:
    """A matrix at `bits` (4 or 8): `values` [K, N] int8 in the type's range, `scales` [N] (per channel) or
    [K / block_size, N] (int4 only)."""
    values: np.ndarray
    scales: np.ndarray
    block_size: int | None
    bits: int = 4
    error: float = float("nan")  # relative output error ||X(W - Wq)||^2 / ||XW||^2 (nan: no activations)
    clipped: float = 0.0  # share of channels whose range the search clipped

    def dequantized(self) -> np.ndarray:
        return self.values.astype(np.float32) * _expand(self.scales, self.block_size, self.values.shape[0])


def blockable(k: int, block_size: int) -> bool:
    """Whether a K-row matrix takes `block_size` blocks: whole blocks only (the EP's LPBQ needs K / block_size
    blocks exactly), more than one."""
    return k % block_size == 0 and k > block_size


def minmax_scales(w: np.ndarray, block_size: int | None, bits: int = 4) -> np.ndarray:
    """Scales covering each channel's (or block's) range: per channel max|w| / QMAX; block-wise on the LPBQ grid."""
    if block_size is None:
        return np.maximum(np.abs(w).max(0) / QMAX[bits], TINY).astype(np.float32)
    k, n = w.shape
    block = np.abs(w).reshape(k // block_size, block_size, n).max(1) / QMAX[4]  # [blocks, N]
    channel = np.maximum(block.max(0) / LPBQ_LEVELS, TINY)
    return lpbq(channel, np.ceil(block / channel - 1e-6))  # ceil: no block's range is clipped


def lpbq(channel: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Block scales on the EP's grid: channel scale x integer 1..16 (`steps` clipped so)."""
    return (channel[None] * np.clip(steps, 1, LPBQ_LEVELS)).astype(np.float32)


def quantize(w: np.ndarray, scales: np.ndarray, block_size: int | None, bits: int = 4) -> Int4:
    q = np.clip(np.round(w / _expand(scales, block_size, w.shape[0])), -QMAX[bits] - 1, QMAX[bits])
    return Int4(q.astype(np.int8), scales.astype(np.float32), block_size, bits)


def relative_error(w: np.ndarray, q: Int4, x: np.ndarray) -> float:
    """||X(W - Wq)||^2 / ||XW||^2 over the rows of x [T, K]."""
    ref = float(np.square(x @ w).sum())
    return float(_column_errors(x, w - q.dequantized()).sum()) / max(ref, TINY)


def int4(w: np.ndarray, block_size: int | None, x: np.ndarray | None = None, search: bool = False,
         bits: int = 4) -> Int4:
    """W [K, N] at int4 (or int8: `bits`; per channel when block_size is None); with `search` and activations
    x [T, K], the scales minimizing the output error; `error` filled when x is given."""
    w = w.astype(np.float32)
    base = minmax_scales(w, block_size, bits)
    if search and x is not None:
        q, clipped = _search(w, x.astype(np.float32), base, block_size, bits)
    else:
        q, clipped = quantize(w, base, block_size, bits), 0.0
    q.clipped = clipped
    if x is not None:
        q.error = relative_error(w, q, x.astype(np.float32))
    return q


def _search(w: np.ndarray, x: np.ndarray, base: np.ndarray, block_size: int | None, bits: int
            ) -> tuple[Int4, float]:
    """Per channel the best ratio of RATIOS (the whole column's output error: exact), then block-wise each block's
    integer among its neighbours (its own share of the error); the block holding a channel's largest scale keeps
    16, so the grid stays the one the EP derives."""
    energy = np.square(x).sum(0)  # each input feature's: the objective's diagonal term (see _column_errors)
    errors = np.stack([_column_errors(x, w - quantize(w, base * r, block_size, bits).dequantized(), energy)
                       for r in RATIOS])
    best = np.asarray(RATIOS, np.float32)[errors.argmin(0)]  # [N]
    scales = base * best
    if block_size is not None:
        scales = _refine_blocks(w, x, scales, block_size)
    return quantize(w, scales, block_size, bits), float((best < 1.0).mean())


def _refine_blocks(w: np.ndarray, x: np.ndarray, scales: np.ndarray, block_size: int) -> np.ndarray:
    channel = scales.max(0) / LPBQ_LEVELS  # [N]
    steps = np.rint(scales / np.maximum(channel, TINY))  # [blocks, N], 16 at each channel's largest
    fixed = steps >= LPBQ_LEVELS
    k = w.shape[0]
    xb = x.reshape(x.shape[0], k // block_size, block_size).transpose(1, 0, 2)  # [blocks, T, bs]
    gram = np.matmul(xb.transpose(0, 2, 1), xb)  # [blocks, bs, bs]: each block's error is e^T G e
    gram = gram + np.eye(block_size, dtype=gram.dtype) * np.diagonal(gram, axis1=1, axis2=2)[:, :, None]  # + diag
    best_steps, best_err = steps, _block_errors(gram, w, lpbq(channel, steps), block_size)
    for d in BLOCK_STEPS:
        trial = np.where(fixed, steps, np.clip(steps + d, 1, LPBQ_LEVELS - 1))
        err = _block_errors(gram, w, lpbq(channel, trial), block_size)
        better = err < best_err
        best_steps, best_err = np.where(better, trial, best_steps), np.where(better, err, best_err)
    return lpbq(channel, best_steps)


def _block_errors(gram: np.ndarray, w: np.ndarray, scales: np.ndarray, block_size: int) -> np.ndarray:
    """Each block's own output error ||X_b (W_b - Q(W_b))||^2 = e_b^T G_b e_b per channel: [blocks, N]."""
    k, n = w.shape
    e = (w - quantize(w, scales, block_size).dequantized()).reshape(k // block_size, block_size, n)
    return (np.matmul(gram, e) * e).sum(1, dtype=np.float64)


def _column_errors(x: np.ndarray, e: np.ndarray, energy: np.ndarray | None = None) -> np.ndarray:
    """||X e_n||^2 per output channel n; with `energy` (each input feature's sum of squares) the search's objective
    e^T (X^T X + diag(X^T X)) e: with fewer calibration rows than input features X^T X is singular, and its errors
    alone would pick scales that fit those rows only (the diagonal is the error if the features were independent)."""
    out = np.empty(e.shape[1], np.float64)
    for c in range(0, e.shape[1], ROW_CHUNK):
        out[c:c + ROW_CHUNK] = np.square(x @ e[:, c:c + ROW_CHUNK]).sum(0)
        if energy is not None:
            out[c:c + ROW_CHUNK] += (energy[:, None] * np.square(e[:, c:c + ROW_CHUNK])).sum(0)
    return out


def _expand(scales: np.ndarray, block_size: int | None, k: int) -> np.ndarray:
    return scales[None] if block_size is None else np.repeat(scales, block_size, axis=0)[:k]
