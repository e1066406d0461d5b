"""SwapStream's invisible watermark: what it carries, how it is laid out, and how it is found again.

The mark says "made by product P, stream S" in every frame that SwapStream modified, survives H.264 at
streaming bitrates and rescaling, and is found without the original (blind detection).

Layout. A frame is divided into 64 x 36 blocks (36 x 64 for portrait frames), defined in normalised
coordinates: the detector resamples whatever it gets to 512 x 288 (8 samples per block), so the
grid is found again after any rescaling of the whole frame. Each block carries 7 chips, one on each
of the 8x8 DCT coefficients (u, v) with u + v in {2, 3}: frequencies low enough to survive x264 and
a downscale, high enough to stay clear of the picture's own large shapes. 64 x 36 x 7 = 16,128 chips.

Payload. 16-bit product id + 32-bit stream id, then a CRC-16 (CCITT) of those 48 bits: 64 bits, which
a rate-1/2, constraint-length-7 convolutional code (generators 133, 171 octal, zero-terminated)
turns into 140 coded bits. Every coded bit is spread over about 115 chips scattered over the whole
frame by a fixed key-derived permutation, each chip multiplied by a key-derived +-1 sequence. So a
bit depends on the whole frame, not on one region that a face or an encoder might wipe out.

Embedding (`Watermarker`) adds the inverse DCT of the chips with a fixed amplitude (strength 1 gives
about 2.3 levels RMS on luma, PSNR ~41 dB) through `swapstream.kernels.watermark`: a CUDA kernel on
the GPU, its NumPy reference on the CPU.

Detection (`detect`), NumPy and OpenCV only: resample luma to 512 x 288 (area average), take each
block's DCT, let each chip vote with its coefficient clipped to +-4 levels (the picture's own
coefficients are far from Gaussian: an edge would swamp a linear correlator) and weighted down in
busy blocks (where the picture, not the mark, sets the signs), correlate with the key sequence per
coded bit, Viterbi-decode with those soft values, and accept only when the CRC matches and the
decoded codeword agrees with the soft values strongly enough (`MIN_SCORE`). The key is public: this
is a disclosure mark that anyone can check, not DRM.
"""

from __future__ import annotations

import functools
import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from .kernels.watermark import BLOCK, BlockPattern, add_luma_delta_fast, block_pattern, \
    embed_watermark, pattern_delta_ref, split_luma_delta

SCHEME = "swapstream-bdct-v1"
"""Name and version of this layout; a different layout must get a new name (and key)."""
PRODUCT_SWAPSTREAM = 0x5353
"""SwapStream's product id ("SS")."""
GRID = (64, 36)
"""Blocks across and down for landscape frames; portrait frames use it transposed."""
COEFFICIENTS: tuple[tuple[int, int], ...] = ((0, 2), (1, 1), (2, 0), (0, 3), (1, 2), (2, 1), (3, 0))
"""(u, v) DCT coefficients that carry chips, u horizontal, v vertical."""
AMPLITUDE = 7.0
"""Chip amplitude at strength 1, in orthonormal 8x8 DCT units of 0..255 luma: about 2.3 levels RMS
on luma, PSNR ~41 dB. 6 (42 dB) lost the frames right after a keyframe when a fast pan over fine
detail was re-encoded at 480p and 1 Mbit/s; 7 kept them (docs/responsible_use.md)."""
PAYLOAD_BITS = 48
CRC_BITS = 16
MESSAGE_BITS = PAYLOAD_BITS + CRC_BITS
_CONV_K = 7
_CONV_G = (0o133, 0o171)
CODED_BITS = 2 * (MESSAGE_BITS + _CONV_K - 1)
"""140: the rate-1/2 code of the 64 message bits plus the 6 tail bits that return it to state 0."""
MIN_SCORE = 0.70
"""Least agreement between the decoded codeword and the soft values (normalised correlation, 1 is
perfect) for a frame to count as marked, on top of the CRC. The best path through noise correlates
too: on unmarked video frames (docs/benchmarks/watermark_robustness.json) and on random soft values
the score has median 0.65 and reaches 0.70 about once in 300 frames; the CRC then passes 1 in
65,536 of those, an estimated one false mark in 20 million unmarked frames. Marked frames after
x264 at 2 Mbit/s score 0.83-1.0."""
CHIP_CLIP = 4.0
"""A chip's coefficient counts up to this many luma levels (DCT units) in the detector's vote."""
BUSY_SCALE = 30.0
"""A block whose AC energy (square root of the sum of squares of its 63 AC coefficients) is this
large votes at half weight in the detector; the mark alone gives about 16."""
MIN_DETECT_SIZE = (320, 180)
"""Smallest frame (either orientation) on which a mark can be found: below it the blocks are a few
pixels wide and the chip frequencies alias."""
_KEY = b"swapstream-watermark-v1"


# -- payload ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    """What a mark says: which product made the frame, and which of its streams."""

    product_id: int
    """16-bit product id (SwapStream: 0x5353)."""
    stream_id: int
    """32-bit id of one output stream or file, chosen per run and printed in the run's log."""

    def __post_init__(self) -> None:
        if not (0 <= self.product_id < 1 << 16):
            raise ValueError(f"product_id must fit in 16 bits, got {self.product_id!r}")
        if not (0 <= self.stream_id < 1 << 32):
            raise ValueError(f"stream_id must fit in 32 bits, got {self.stream_id!r}")

    @classmethod
    def new_stream(cls, product_id: int = PRODUCT_SWAPSTREAM) -> "Payload":
        """A payload with a fresh random stream id."""
        return cls(product_id, secrets.randbits(32))

    def bits(self) -> np.ndarray:
        """The 48 payload bits, most significant first: product id, then stream id."""
        v = (self.product_id << 32) | self.stream_id
        return np.array([(v >> (PAYLOAD_BITS - 1 - i)) & 1 for i in range(PAYLOAD_BITS)], np.uint8)

    @classmethod
    def from_bits(cls, bits: np.ndarray) -> "Payload":
        v = 0
        for b in bits[:PAYLOAD_BITS]:
            v = (v << 1) | int(b)
        return cls(v >> 32, v & 0xFFFFFFFF)

    def __str__(self) -> str:
        return f"product {self.product_id:#06x} stream {self.stream_id:#010x}"


def crc16(bits: np.ndarray) -> np.ndarray:
    """CRC-16/CCITT-FALSE (polynomial 0x1021, initial 0xFFFF) of a bit sequence, as 16 bits."""
    reg = 0xFFFF
    for b in bits:
        top = (reg >> 15) & 1
        reg = (reg << 1) & 0xFFFF
        if top ^ int(b):
            reg ^= 0x1021
    return np.array([(reg >> (15 - i)) & 1 for i in range(16)], np.uint8)


# -- the convolutional code -------------------------------------------------------------------------


def _parity(x: int) -> int:
    return bin(x).count("1") & 1


@functools.cache
def _trellis() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every state (the last 6 input bits): its two predecessors (state, input bit) and the
    +-1 code symbols emitted on each of those transitions."""
    n_states = 1 << (_CONV_K - 1)
    pred_state = np.zeros((n_states, 2), np.int64)
    pred_bit = np.zeros((n_states, 2), np.int64)
    symbols = np.zeros((n_states, 2, 2), np.float64)
    filled = np.zeros(n_states, np.int64)
    for s in range(n_states):
        for b in (0, 1):
            reg = (b << (_CONV_K - 1)) | s           # newest bit on top
            nxt = reg >> 1
            j = filled[nxt]
            pred_state[nxt, j], pred_bit[nxt, j] = s, b
            symbols[nxt, j] = [2.0 * _parity(reg & g) - 1.0 for g in _CONV_G]
            filled[nxt] += 1
    return pred_state, pred_bit, symbols


def conv_encode(bits: np.ndarray) -> np.ndarray:
    """Rate-1/2 code of `bits` plus 6 zero tail bits: 2 (len + 6) bits."""
    state = 0
    out: list[int] = []
    for b in list(bits) + [0] * (_CONV_K - 1):
        reg = (int(b) << (_CONV_K - 1)) | state
        out.extend(_parity(reg & g) for g in _CONV_G)
        state = reg >> 1
    return np.array(out, np.uint8)


def viterbi_decode(soft: np.ndarray, n_bits: int) -> np.ndarray:
    """Maximum-likelihood message for soft values (> 0 means 1), zero-terminated code."""
    pred_state, pred_bit, symbols = _trellis()
    steps = n_bits + _CONV_K - 1
    pairs = np.asarray(soft, np.float64).reshape(steps, 2)
    metric = np.full(pred_state.shape[0], -np.inf)
    metric[0] = 0.0
    back = np.zeros((steps, pred_state.shape[0]), np.int64)
    rows = np.arange(pred_state.shape[0])
    tail_block = np.where(pred_bit == 0, 0.0, -np.inf)
    for t in range(steps):
        cand = metric[pred_state] + symbols @ pairs[t]
        if t >= n_bits:                      # the tail only shifts in zeros
            cand = cand + tail_block
        j = np.argmax(cand, axis=1)
        metric = cand[rows, j]
        back[t] = pred_state[rows, j] * 2 + pred_bit[rows, j]
    state, bits = 0, []
    for t in range(steps - 1, -1, -1):
        v = int(back[t, state])
        bits.append(v & 1)
        state = v >> 1
    return np.array(bits[::-1][:n_bits], np.uint8)


def encode_payload(payload: Payload) -> np.ndarray:
    """The 140 coded bits of a payload."""
    msg = payload.bits()
    return conv_encode(np.concatenate([msg, crc16(msg)]))


# -- layout -----------------------------------------------------------------------------------------


def grid_for(height: int, width: int) -> tuple[int, int]:
    """(blocks across, blocks down) for a frame: `GRID`, transposed for portrait frames."""
    return GRID if width >= height else (GRID[1], GRID[0])


def _coefficients_for(grid: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    # Transposing the grid transposes the frequencies too, so a portrait frame is a rotated
    # landscape one as far as the chips are concerned.
    return COEFFICIENTS if grid == GRID else tuple((v, u) for u, v in COEFFICIENTS)


@functools.cache
def _key_sequences() -> tuple[np.ndarray, np.ndarray]:
    """(chip signs +-1, coded bit of each chip) for the chip index in (row, column, k) order.

    Derived from SHAKE-256 of the public key, not from a NumPy generator, so that the layout is a
    fixed specification that no library upgrade can change.
    """
    n = GRID[0] * GRID[1] * len(COEFFICIENTS)
    stream = hashlib.shake_256(_KEY).digest(n + 4 * n)
    pn = np.where(np.frombuffer(stream[:n], np.uint8) & 1, 1, -1).astype(np.int8)
    keys = np.frombuffer(stream[n:], dtype=">u4").astype(np.int64)
    order = np.argsort(keys * n + np.arange(n), kind="stable")   # ties broken by index
    bit_of = np.empty(n, np.int64)
    bit_of[order] = np.arange(n) % CODED_BITS
    pn.setflags(write=False)
    bit_of.setflags(write=False)
    return pn, bit_of


def chip_signs(payload: Payload, grid: tuple[int, int] = GRID) -> np.ndarray:
    """The (blocks down, blocks across, K) int8 chips of a payload on `grid`."""
    pn, bit_of = _key_sequences()
    coded = encode_payload(payload).astype(np.int8) * 2 - 1
    return np.ascontiguousarray((pn * coded[bit_of]).reshape(grid[1], grid[0], len(COEFFICIENTS)))


# -- embedding --------------------------------------------------------------------------------------


class Watermarker:
    """Marks frames of one stream with one payload. Tables are built once per frame size (and per
    device for CuPy frames) and kept; `embed` then costs one pass over the frame.

    Safe to share between threads that embed into different frames: the caches only ever gain
    entries, and an entry built twice by a race is identical.
    """

    def __init__(self, payload: Payload, strength: float = 1.0) -> None:
        if not (math.isfinite(strength) and strength > 0):
            raise ValueError(f"strength must be a finite number > 0, got {strength!r}")
        self.payload = payload
        self.strength = strength
        self._host: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._device: dict[tuple[int, int, int], tuple[Any, BlockPattern]] = {}

    def _tables(self, h: int, w: int) -> tuple[np.ndarray, BlockPattern]:
        grid = grid_for(h, w)
        return (chip_signs(self.payload, grid),
                block_pattern(h, w, grid, _coefficients_for(grid), AMPLITUDE * self.strength))

    def device_tables(self, h: int, w: int) -> tuple[Any, BlockPattern]:
        """(chips, pattern) for (h, w) frames on the current CUDA device, uploaded once."""
        import cupy

        key = (h, w, cupy.cuda.runtime.getDevice())
        dev = self._device.get(key)
        if dev is None:
            signs, pattern = self._tables(h, w)
            dev = self._device.setdefault(key, (cupy.asarray(signs), pattern.to(cupy)))
        return dev

    def embed(self, frame: Any) -> None:
        """Mark an (H, W, 3) uint8 RGB frame in place: NumPy on the CPU, CuPy on its device."""
        h, w = int(frame.shape[0]), int(frame.shape[1])
        if type(frame).__module__.startswith("cupy"):
            embed_watermark(frame, *self.device_tables(h, w))
            return
        planes = self._host.get((h, w))
        if planes is None:
            # The CPU path adds a cached offset map: the reference's pattern step depends only on
            # the payload and the frame size, so it is computed once per stream and size, and kept
            # as the saturating-add planes of `add_luma_delta_fast` (bit-identical to the reference).
            planes = self._host.setdefault((h, w), split_luma_delta(pattern_delta_ref(*self._tables(h, w))))
        add_luma_delta_fast(frame, *planes)


# -- detection --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detection:
    """What `detect` found in one frame."""

    found: bool
    """A mark is there: the CRC matches and `score` >= MIN_SCORE."""
    payload: Payload | None
    """The payload when found."""
    score: float
    """Normalised correlation of the soft values with the best codeword (1 = perfect, ~0.65 = noise)."""
    soft: np.ndarray
    """The 140 soft values (kept so that several frames can be combined)."""
    reason: str = ""
    """Why nothing was found, when nothing was: 'frame too small', 'no signal', 'CRC mismatch',
    'weak signal'."""


@functools.cache
def _dct_matrix() -> np.ndarray:
    n = BLOCK
    m = np.empty((n, n), np.float64)
    for u in range(n):
        a = math.sqrt(1.0 / n) if u == 0 else math.sqrt(2.0 / n)
        m[u] = a * np.cos(np.pi * (2 * np.arange(n) + 1) * u / (2 * n))
    return m.astype(np.float32)


def soft_bits(luma: np.ndarray) -> np.ndarray | None:
    """The 140 soft coded-bit values of a luma plane (any size, any scale), or None when the frame
    is too small to carry a mark. Each value is the key-weighted sum of its chips' votes over the
    root of their summed squares: about N(0, 1) without a mark."""
    if luma.ndim != 2:
        raise ValueError(f"luma must be a 2-D array, got shape {tuple(luma.shape)}")
    h, w = luma.shape
    if min(h, w) < min(MIN_DETECT_SIZE) or max(h, w) < max(MIN_DETECT_SIZE):
        return None
    gx, gy = grid_for(h, w)
    canon = cv2.resize(luma.astype(np.float32), (gx * BLOCK, gy * BLOCK), interpolation=cv2.INTER_AREA)
    blocks = canon.reshape(gy, BLOCK, gx, BLOCK).transpose(0, 2, 1, 3)        # (by, bx, y, x)
    d = _dct_matrix()
    coef = np.einsum("vy,abyx,ux->abvu", d, blocks, d, optimize=True)          # (by, bx, v, u)
    us = [u for u, _ in _coefficients_for((gx, gy))]
    vs = [v for _, v in _coefficients_for((gx, gy))]
    # Each chip votes with its coefficient clipped to +-CHIP_CLIP, so that no edge outvotes the rest,
    # and the votes of a block count less the busier the block is: the picture's own texture, not
    # the mark, decides the signs of a busy block's coefficients, and a codec keeps little of the
    # mark there. Measured after x264 (docs/responsible_use.md), this gets 25-80% more signal per
    # coded bit out of the same frames than plain signs.
    busy = np.sqrt(np.maximum((coef * coef).sum(axis=(2, 3)) - coef[:, :, 0, 0] ** 2, 0.0))
    weight = 1.0 / (1.0 + (busy / BUSY_SCALE) ** 2)                            # (by, bx)
    votes = np.clip(coef[:, :, vs, us] / CHIP_CLIP, -1.0, 1.0) * weight[:, :, None]
    pn, bit_of = _key_sequences()
    z = votes.reshape(-1) * pn
    sums = np.bincount(bit_of, weights=z, minlength=CODED_BITS)
    # Normalised by the votes' own spread: without a mark each value is then about N(0, 1).
    power = np.bincount(bit_of, weights=z * z, minlength=CODED_BITS)
    return np.where(power > 0, sums / np.sqrt(np.maximum(power, 1e-12)), 0.0)


def decode_soft(soft: np.ndarray) -> Detection:
    """Decode 140 soft values (one frame's, or several frames' summed) into a Detection."""
    norm = float(np.linalg.norm(soft))
    if norm < 1e-9:
        return Detection(False, None, 0.0, soft, "no signal")
    msg = viterbi_decode(soft, MESSAGE_BITS)
    codeword = conv_encode(msg).astype(np.float64) * 2 - 1
    score = float(soft @ codeword / (norm * math.sqrt(CODED_BITS)))
    if not np.array_equal(crc16(msg[:PAYLOAD_BITS]), msg[PAYLOAD_BITS:]):
        return Detection(False, None, score, soft, "CRC mismatch")
    if score < MIN_SCORE:
        return Detection(False, None, score, soft, "weak signal")
    return Detection(True, Payload.from_bits(msg), score, soft)


def detect(luma: np.ndarray) -> Detection:
    """Look for a mark in one frame's luma plane (2-D, any size), without the original."""
    soft = soft_bits(luma)
    if soft is None:
        return Detection(False, None, 0.0, np.zeros(CODED_BITS), "frame too small")
    return decode_soft(soft)


def luma_of(rgb: np.ndarray) -> np.ndarray:
    """BT.601 luma of an RGB uint8 frame, float32 (what an encoder's Y plane holds, up to range)."""
    return rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
