"""Watermark v2: a self-synchronising tiled mark that survives crops, rescales, letterboxing,
horizontal flips and small rotations, perceptually shaped, found by accumulating frames.

Design (the smallest one from the literature that covers those attacks):
- Periodic tiling for synchronisation (Kutter, "Watermarking resisting to translation, rotation,
  and scaling", Proc. SPIE 3528, 1998; the tile-autocorrelation idea also in Kalker, Depovere,
  Haitsma and Maes, "A video watermarking system for broadcast monitoring", Proc. SPIE 3657,
  1999). One 32 x 32-chip tile is repeated over the whole frame. A repeated pattern makes the
  autocorrelation of the frame's high-pass residual peak on the tiling lattice, wherever the frame
  was cut and whatever it was scaled or turned by: the two lattice vectors give scale and rotation.
  Crops, letterbox bars and the tile phase are then only a cyclic shift of the tile, found by
  correlating the folded tile (all tiles added together) with a known synchronisation pattern
  (Pereira and Pun's template idea, "Robust template matching for affine resistant image
  watermarks", IEEE Trans. Image Process. 9(6), 2000, here carried in the tile itself). A
  horizontal flip mirrors the tile: the detector tries the mirrored template too. A log-polar
  (Fourier-Mellin) embedding (O Ruanaidh and Pun, 1998) would also cover any rotation, at the cost
  of an interpolation-heavy embedder; +-5 degrees do not need it.
- Payload: v1's 48 bits (product id, stream id) with its CRC-16 and rate-1/2 convolutional code,
  140 coded bits, each spread over about 7 chips of every tile (so over every tile of every frame).
  The tile is 0.4 x the synchronisation pattern + 0.6 x the data pattern, both +-1 per chip,
  derived from SHAKE-256 of a public key (a disclosure mark, not DRM).
- Geometry: a chip is 1/72 of the frame's shorter side (10 px at 720p, 15 at 1080p), drawn with
  bilinear interpolation between chip centres (smooth: no chip edges for the encoder to pay for);
  the chips alternate sign in a checkerboard, which puts the pattern's energy in a band around half
  the chip rate, clear of the picture's low frequencies.
- Perceptual shaping (kernels/watermark_v2.py): the pattern is scaled per 8 x 8 block by the
  block's mean luma gradient, between `MASK.m_lo` on flat blocks and `MASK.m_hi` on busy ones.
- Detection (`WindowDetector`): every frame is resampled to a working height of 240 px and whitened
  (high-pass, divided by its local spread); the window's residuals are summed (the mark adds up,
  moving content does not); candidate lattices come from the autocorrelation of the sum, each is
  folded onto one tile and matched to the synchronisation pattern (both mirror images), the best
  two are refined in scale and angle on that match, and the 140 soft values of the folds with the
  highest sync peaks (up to `LIST_DECODE`, best first, until one passes) are decoded as v1's
  (Viterbi, CRC-16, `watermark.MIN_SCORE`). A 2 s window decides where single frames do not.
- Moving camera (`WindowDetector`, second try): on a pan the window sum does not average the
  picture out (the same texture passes by again and again), and an encoder's motion compensation
  drags the static mark along with the picture in its predicted frames, so the mark that stays put
  is a small share of what was embedded. The detector follows the picture's global motion (phase
  correlation of the residuals), keeps a motion-registered mean of the window (the picture without
  the mark, which is smeared there because it does not move with the picture), and when the plain
  sum does not decode, decodes the sum of every frame minus that mean at its place, without the
  edge strips that the pan brings in and without what stays put in the frame (outliers), and with
  the unattacked lattice among the candidates. Pan clip after the upload encode, measured with the
  weaker mask before dac0555 (full scale from 6 levels, `MASK`): the plain sum kept
  19% of the static mark and its picture did not average out (rms 11.9 against the mark's 2.3, sync
  5.1 on the right lattice, no lattice found); the cleaned sum has rms 0.75 and sync 14.

The embedding is the same on every frame (the tile does not move), so frames add coherently.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import threading
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from .kernels.watermark_v2 import CpuScratch, MaskParams, embed_masked
from .watermark import CODED_BITS, Detection, Payload, decode_soft, encode_payload

SCHEME = "swapstream-tile-v2"
"""Name and version of this layout; a different layout must get a new name (and key)."""
_KEY = b"swapstream-watermark-v2"
TILE = 32
"""Chips per tile side."""
CHIPS_PER_SIDE = 72
"""Chips along the frame's shorter side: 10 px chips at 720p. Measured (tools/watermark_robustness.py
--v2): 144 (5 px) was lost after 480p at 1 Mbit/s where 72 was kept; bigger chips would leave too few
tiles on a cropped frame for the lattice to show."""
AMPLITUDE = 4.0
"""Peak pattern value (luma levels) of a chip where sync and data agree, before the mask: PSNR
42.1 dB on the noisy clip (texture everywhere: the mask at its top), 44.2 dB on the demo clip."""
MASK = MaskParams(inv_act=1.0 / 2.5, m_lo=0.3, m_hi=1.0)
"""Texture mask: full scale from a mean |luma difference| of 2.5 levels per pixel up, 0.3 on flat
blocks (where a change shows and an encoder would spend bits on it).

Full scale from 6 levels (before dac0555) left the mark too weak on a pan's moderately textured
blocks: after the upload and a 0.5x rescale with its re-encode, x264's predicted frames carry the
last keyframe's mark along with the picture, and the 2 s windows holding no keyframe failed. On
that chain over 6 random stream ids (docs/benchmarks/watermark_payload_sweep.md), windows decoded:
5 of 30 from 6 levels (0 of the 18 without a keyframe), 12 of 30 from 4, 30 of 30 from 3 (data
scores of the keyframe-less ones 0.708-0.816, against the 0.70 gate) and from 2.5 (0.762-0.853).
(4 levels, dac0555, had decoded the benchmark's one payload in 5 of 5 windows: one stream id does not
stand for all.) Mark PSNR at 2.5 in the robustness benchmark: 43.6 dB on the pan, 44.2 on the demo
clip (45.3 and 46.4 at 6); the noisy clip is at the mask's top either way (42.1). The price is
bitrate at equal CRF (watermark_robustness_v2.md)."""
WORK_SIDE = 240
"""The detector's working height (shorter side): a chip is then 3.3 px before any attack, 2.5 px
after letterboxing into 4:3 (at 180, 1.9 px there, the alternating chips came near the working
frame's Nyquist limit and were lost)."""
CANON_CHIP = 4
"""Bins per chip side of the folded tile. The chips alternate in sign, so a fold that is half a chip
off cancels them: 4 bins keep the best shift within an eighth of a chip (2 bins lost a crop of 10%
per side, whose cut falls anywhere inside a chip)."""
SCALE_RANGE = (0.6, 1.6)
"""Tile periods searched, relative to an unattacked frame: crops of 10% per side make the tile
1.25 times larger on the working frame, a 16:9 frame letterboxed into 4:3 0.75 times."""
MAX_ROTATION_DEG = 7.0
"""Lattice directions searched around the axes: +-5 degrees and some margin."""
MIN_DETECT_SIDE = 120
"""Shorter side (pixels) under which no detection is tried: the tile would span most of the frame."""
BAR_STD = 3.0
"""Luma spread (standard deviation, levels) under which an edge row or column of a frame is a bar
(letterbox, pillarbox, a player's border) rather than picture: re-encoded black bars stay under 1-2
levels, picture rows over 3 almost always."""
BAR_MAX_FRACTION = 0.3
"""Most of a frame's height (or width) that bars on one side may take; more is a dark scene, not a bar."""


# -- layout -----------------------------------------------------------------------------------------


@functools.cache
def _key_sequences() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sync +-1, data pn +-1, coded bit of each chip), each (TILE, TILE), from SHAKE-256 of the key:
    a fixed specification that no library upgrade changes."""
    n = TILE * TILE
    stream = hashlib.shake_256(_KEY).digest(2 * n + 4 * n)
    # Both sequences alternate sign from chip to chip (a checkerboard): the pattern's energy then sits
    # in a band around half the chip rate, away from the low frequencies where the picture's own
    # energy is (and which the detector's high-pass removes).
    i, j = np.divmod(np.arange(n), TILE)
    board = np.where((i + j) % 2 == 0, 1, -1).astype(np.int8)
    sync = (np.where(np.frombuffer(stream[:n], np.uint8) & 1, 1, -1) * board).astype(np.int8)
    pn = (np.where(np.frombuffer(stream[n:2 * n], np.uint8) & 1, 1, -1) * board).astype(np.int8)
    keys = np.frombuffer(stream[2 * n:], dtype=">u4").astype(np.int64)
    order = np.argsort(keys * n + np.arange(n), kind="stable")
    bit_of = np.empty(n, np.int64)
    bit_of[order] = np.arange(n) % CODED_BITS
    out = (sync.reshape(TILE, TILE), pn.reshape(TILE, TILE), bit_of.reshape(TILE, TILE))
    for a in out:
        a.setflags(write=False)
    return out


SYNC_WEIGHT = 0.4
"""Share of the chip amplitude that carries the sync pattern; the data gets the rest (0.6). The sync
is one decision over all 1,024 chips of the tile, each coded bit one over about 7: with the two at
half each, windows whose sync stood 11 standard deviations out still failed the CRC, so the data
gets more (+1.6 dB per coded bit for 2 dB less sync)."""


def tile_values(payload: Payload) -> np.ndarray:
    """The (TILE, TILE) float32 chip values of a payload: SYNC_WEIGHT sync + (1 - SYNC_WEIGHT) data,
    in {-1, -0.2, 0.2, 1}."""
    sync, pn, bit_of = _key_sequences()
    coded = encode_payload(payload).astype(np.int8) * 2 - 1
    return (SYNC_WEIGHT * sync + (1.0 - SYNC_WEIGHT) * (pn * coded[bit_of])).astype(np.float32)


def chip_size(height: int, width: int) -> float:
    """Pixels per chip on a (height, width) frame."""
    return min(height, width) / CHIPS_PER_SIDE


def render_tiled(values: np.ndarray, height: int, width: int, chip: float) -> np.ndarray:
    """`values` (TILE, TILE) tiled over a (height, width) frame with chips of `chip` pixels, by
    bilinear interpolation between chip centres (cyclic): (height, width) float64."""
    def axis(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        u = (np.arange(n) + 0.5) / chip - 0.5
        i0 = np.floor(u)
        f = u - i0
        i0 = i0.astype(np.int64) % TILE
        return i0, (i0 + 1) % TILE, f

    y0, y1, fy = axis(height)
    x0, x1, fx = axis(width)
    v = values.astype(np.float64)
    top = v[y0][:, x0] * (1 - fx) + v[y0][:, x1] * fx
    bottom = v[y1][:, x0] * (1 - fx) + v[y1][:, x1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


def pattern_for(payload: Payload, height: int, width: int, strength: float = 1.0) -> np.ndarray:
    """The (height, width) float32 pattern at mask scale 1 (luma levels)."""
    return np.ascontiguousarray((AMPLITUDE * strength * render_tiled(
        tile_values(payload), height, width, chip_size(height, width))).astype(np.float32))


class WatermarkerV2:
    """Marks frames of one stream with one payload (NumPy on the CPU, CuPy on its device). The
    pattern is built once per frame size and kept; each frame then costs one masked add."""

    def __init__(self, payload: Payload, strength: float = 1.0, mask: MaskParams = MASK) -> None:
        if not (math.isfinite(strength) and strength > 0):
            raise ValueError(f"strength must be a finite number > 0, got {strength!r}")
        self.payload = payload
        self.strength = strength
        # The texture mask: `MASK` in the product; tools/watermark_payload_sweep.py compares others.
        self.mask = mask
        self._host: dict[tuple[int, int], np.ndarray] = {}
        self._device: dict[tuple[int, int, int], Any] = {}
        # The CPU path's working arrays for the last frame size, one set per thread: a job's
        # disclosure may mark frames of several sessions (serve's WHIP) from their own threads.
        self._local = threading.local()

    def pattern(self, h: int, w: int) -> np.ndarray:
        p = self._host.get((h, w))
        if p is None:
            p = self._host.setdefault((h, w), pattern_for(self.payload, h, w, self.strength))
        return p

    def embed(self, frame: Any) -> None:
        """Mark an (H, W, 3) uint8 RGB frame in place."""
        h, w = int(frame.shape[0]), int(frame.shape[1])
        if type(frame).__module__.startswith("cupy"):
            import cupy

            key = (h, w, cupy.cuda.runtime.getDevice())
            dev = self._device.get(key)
            if dev is None:
                dev = self._device.setdefault(key, cupy.asarray(self.pattern(h, w)))
            embed_masked(frame, dev, self.mask)
            return
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.shape != (h, w):
            scratch = self._local.scratch = CpuScratch(h, w)
        embed_masked(frame, self.pattern(h, w), self.mask, scratch)


# -- detection --------------------------------------------------------------------------------------


def _residual(luma: np.ndarray) -> np.ndarray:
    """The whitened high-pass residual of a luma plane at the working size (float32)."""
    h, w = luma.shape
    s = WORK_SIDE / min(h, w)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    work = cv2.resize(luma.astype(np.float32), size, interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR)
    # The chip (3.3 px, alternating) survives a 2-pixel Gaussian's removal; the picture's large
    # shapes do not.
    r = work - cv2.GaussianBlur(work, (0, 0), 2.0)
    # Each region counts by its own spread: textured areas, where both the mark and the noise are
    # larger, do not outvote flat ones, and an edge's ringing is clipped.
    spread = np.sqrt(cv2.GaussianBlur(r * r, (0, 0), 6.0)) + 0.5
    return np.clip(r / spread, -2.5, 2.5).astype(np.float32)


def picture_box(luma: np.ndarray) -> tuple[slice, slice]:
    """The frame less the flat bars along its edges (letterbox or pillarbox bars, a player's border):
    rows and columns from each edge inwards whose luma varies by less than BAR_STD, up to
    BAR_MAX_FRACTION of the frame on each side.

    The bars hold no mark, their edge is the strongest line in the residual, and they make the
    working frame's scale that of the bars plus the picture: cut off, a letterboxed picture is read
    at the scale it was marked at."""
    h, w = luma.shape
    f = luma.astype(np.float32)
    row_flat = f.std(axis=1) < BAR_STD
    col_flat = f.std(axis=0) < BAR_STD

    def run(flat: np.ndarray, limit: int) -> int:
        n = 0
        while n < limit and flat[n]:
            n += 1
        return n

    if row_flat.all():  # a flat frame (a fade to black): no bars to tell from the picture
        return slice(0, h), slice(0, w)
    my, mx = int(h * BAR_MAX_FRACTION), int(w * BAR_MAX_FRACTION)
    top, bottom = run(row_flat, my), run(row_flat[::-1], my)
    left, right = run(col_flat, mx), run(col_flat[::-1], mx)
    return slice(top, h - bottom), slice(left, w - right)


def _autocorr(r: np.ndarray) -> np.ndarray:
    """Linear autocorrelation of `r` (zero padding to twice its size), lag (0, 0) at [0, 0]."""
    h, w = r.shape
    f = np.fft.rfft2(r, s=(2 * h, 2 * w))
    return np.fft.irfft2(f * np.conj(f), s=(2 * h, 2 * w)).astype(np.float32)


@dataclass(frozen=True)
class Lattice:
    """Two tiling vectors (working pixels, (dx, dy)) and how clearly they stood out."""

    v1: tuple[float, float]
    v2: tuple[float, float]
    contrast: float


def _peak_near(a: np.ndarray, cx: float, cy: float, radius: int) -> tuple[float, float, float]:
    """Sub-pixel location and height of the highest value of the (fft-shifted) map `a` within
    `radius` of (cx, cy)."""
    h, w = a.shape
    x0, x1 = max(int(cx) - radius, 1), min(int(cx) + radius + 1, w - 1)
    y0, y1 = max(int(cy) - radius, 1), min(int(cy) + radius + 1, h - 1)
    win = a[y0:y1, x0:x1]
    j = int(np.argmax(win))
    py, px = divmod(j, win.shape[1])
    py, px = py + y0, px + x0
    v = float(a[py, px])

    def offset(l: float, c: float, r: float) -> float:
        den = l - 2 * c + r
        return 0.0 if den >= 0 else float(np.clip(0.5 * (l - r) / den, -0.5, 0.5))

    ox = offset(a[py, px - 1], v, a[py, px + 1]) if 0 < px < w - 1 else 0.0
    oy = offset(a[py - 1, px], v, a[py + 1, px]) if 0 < py < h - 1 else 0.0
    return px + ox, py + oy, v


def _sector_peaks(hp: np.ndarray, sector: np.ndarray, k: int) -> list[tuple[int, int, float]]:
    """The `k` highest local maxima of `hp` inside `sector` (at least 4 px apart): (x, y, height)."""
    masked = np.where(sector, hp, -np.inf).astype(np.float32)
    peaks = []
    for _ in range(k):
        idx = int(np.argmax(masked))
        py, px = divmod(idx, masked.shape[1])
        v = float(masked[py, px])
        if not np.isfinite(v):
            break
        peaks.append((px, py, v))
        masked[max(py - 4, 0):py + 5, max(px - 4, 0):px + 5] = -np.inf
    return peaks


def _refine(hp: np.ndarray, px: int, py: int, cx: int, cy: int) -> tuple[float, float, float]:
    """Sub-pixel lattice vector from a peak and its 2nd and 3rd multiples (where the same sub-pixel
    error is divided by 2 and 3)."""
    h, w = hp.shape
    sx, sy, height = _peak_near(hp, px, py, 1)
    vx, vy = sx - cx, sy - cy
    est = [(vx, vy, 1.0)]
    for k in (2, 3):
        tx, ty = cx + k * vx, cy + k * vy
        if 3 <= tx < w - 3 and 3 <= ty < h - 3:
            qx, qy, qh = _peak_near(hp, tx, ty, 2)
            if qh > 3.0:
                est.append(((qx - cx) / k, (qy - cy) / k, float(k)))
    wsum = sum(e[2] for e in est)
    return sum(e[0] * e[2] for e in est) / wsum, sum(e[1] * e[2] for e in est) / wsum, height


@functools.lru_cache(maxsize=16)
def _offsets(ya: int, yb: int, xa: int, xb: int) -> tuple[np.ndarray, np.ndarray]:
    """(dy, dx) grids of the offsets ya..yb-1, xa..xb-1 (cached: every frame of a size asks again)."""
    dy, dx = np.mgrid[ya:yb, xa:xb]
    dy.setflags(write=False)
    dx.setflags(write=False)
    return dy, dx


def lattice_candidates(acf: np.ndarray, nominal: float, per_axis: int = 3) -> list[Lattice]:
    """Possible tiling lattices in an autocorrelation (lag (0, 0) at [0, 0]), likeliest first; `nominal`
    is the tile period in working pixels of an unattacked frame. The picture's own repeats (stripes,
    tiles, a fence) also make peaks, so several are kept and the synchronisation pattern decides."""
    a = np.fft.fftshift(acf)
    h, w = a.shape
    cy, cx = h // 2, w // 2
    # Peaks, not the picture's smooth correlation: subtract the local mean, divide by the spread.
    hp = a - cv2.blur(a, (9, 9))
    hp = hp / (float(np.std(hp)) + 1e-12)
    # The search ring lies within rmax of the centre: its masks are built on that box only.
    rmax = int(math.ceil(SCALE_RANGE[1] * nominal)) + 1
    y0, y1, x0, x1 = max(cy - rmax, 0), min(cy + rmax + 1, h), max(cx - rmax, 0), min(cx + rmax + 1, w)
    dy, dx = _offsets(y0 - cy, y1 - cy, x0 - cx, x1 - cx)
    rad = np.hypot(dx, dy)
    ang = np.degrees(np.arctan2(dy, dx))
    ring = (rad >= SCALE_RANGE[0] * nominal) & (rad <= SCALE_RANGE[1] * nominal)
    box = hp[y0:y1, x0:x1]
    found: list[list[tuple[float, float, float]]] = []
    for axis_deg in (0.0, 90.0):
        d = np.abs((ang - axis_deg + 180.0) % 360.0 - 180.0)
        found.append([_refine(hp, px + x0, py + y0, cx, cy)
                      for px, py, _ in _sector_peaks(box, ring & (d <= MAX_ROTATION_DEG), per_axis)])
    out: list[Lattice] = []
    for ax, ay, ha in found[0]:
        la = math.hypot(ax, ay)
        # A tiling only scales and turns: the partner of a vector is the same length at a right angle.
        for bx, by, hb in found[1]:
            lb = math.hypot(bx, by)
            if abs(la - lb) <= 0.04 * max(la, lb) and abs(ax * bx + ay * by) <= 0.08 * la * lb:
                out.append(Lattice((ax, ay), (bx, by), min(ha, hb)))
        out.append(Lattice((ax, ay), (-ay, ax), ha))
    for bx, by, hb in found[1]:
        out.append(Lattice((by, -bx), (bx, by), hb))
    out.sort(key=lambda lat: -lat.contrast)
    return out


@functools.lru_cache(maxsize=8)
def _centres(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) of every pixel centre of an (h, w) frame, flattened (cached per size)."""
    ys, xs = np.mgrid[0:h, 0:w]
    py, px = ys.ravel() + 0.5, xs.ravel() + 0.5
    py.setflags(write=False)
    px.setflags(write=False)
    return py, px


def _fold(r: np.ndarray, lat: Lattice) -> tuple[np.ndarray, np.ndarray]:
    """Sum every pixel of `r` into one tile of (TILE * CANON_CHIP)^2 bins along the lattice:
    (sums, counts)."""
    n = TILE * CANON_CHIP
    h, w = r.shape
    m = np.array([[lat.v1[0], lat.v2[0]], [lat.v1[1], lat.v2[1]]], np.float64)
    inv = np.linalg.inv(m) * n                        # working pixel -> canonical tile pixels
    py, px = _centres(h, w)
    qx = inv[0, 0] * px + inv[0, 1] * py
    qy = inv[1, 0] * px + inv[1, 1] * py
    idx = (np.floor(qy).astype(np.int64) % n) * n + (np.floor(qx).astype(np.int64) % n)
    sums = np.bincount(idx, weights=r.ravel().astype(np.float64), minlength=n * n).reshape(n, n)
    counts = np.bincount(idx, minlength=n * n).reshape(n, n).astype(np.float64)
    return sums, counts


@functools.cache
def _templates() -> tuple[np.ndarray, np.ndarray]:
    """(sync tile, data basis): the sync pattern and each coded bit's chips (with their pn signs)
    rendered at CANON_CHIP pixels per chip as the folded tile sees them; the basis is
    (CODED_BITS, n * n)."""
    n = TILE * CANON_CHIP
    sync, pn, bit_of = _key_sequences()
    s = render_tiled(sync.astype(np.float64), n, n, CANON_CHIP)
    basis = np.zeros((CODED_BITS, n * n))
    for k in range(CODED_BITS):
        vals = np.where(bit_of == k, pn, 0).astype(np.float64)
        basis[k] = render_tiled(vals, n, n, CANON_CHIP).ravel()
    s.setflags(write=False)
    basis.setflags(write=False)
    return s, basis


@functools.cache
def _template_spectra() -> tuple[np.ndarray, np.ndarray]:
    """Conjugate spectra of the sync tile and of its mirror image, for `align`."""
    s, _ = _templates()
    out = (np.conj(np.fft.fft2(s)), np.conj(np.fft.fft2(s[:, ::-1])))
    for a in out:
        a.setflags(write=False)
    return out


@dataclass(frozen=True)
class Alignment:
    shift: tuple[int, int]
    """(dy, dx): the folded tile is the template rolled by this much."""
    flipped: bool
    """The picture was mirrored left to right."""
    peak: float
    """The synchronisation correlation peak, in standard deviations of the correlation surface."""


def align(tile: np.ndarray) -> Alignment:
    """The cyclic shift (and mirror) that best matches the folded tile to the sync pattern."""
    ft = np.fft.fft2(tile)
    best: Alignment | None = None
    for flipped, conj_t in zip((False, True), _template_spectra()):
        c = np.real(np.fft.ifft2(ft * conj_t))
        z = (c - c.mean()) / (c.std() + 1e-12)
        j = int(np.argmax(z))
        dy, dx = divmod(j, c.shape[1])
        cand = Alignment((dy, dx), flipped, float(z.flat[j]))
        if best is None or cand.peak > best.peak:
            best = cand
    assert best is not None
    return best


def soft_from_tile(tile: np.ndarray, al: Alignment) -> np.ndarray:
    """The 140 soft values of a folded tile, undoing its shift and mirror: about N(0, 1) each
    without a mark."""
    _, basis = _templates()
    t = np.roll(tile, (-al.shift[0], -al.shift[1]), axis=(0, 1))
    if al.flipped:
        t = t[:, ::-1]
    # The sync part is known: take it out so that it does not leak into the data correlations.
    s, _ = _templates()
    gain = float((t * s).sum() / (s * s).sum())
    t = (t - gain * s).ravel()
    sigma = float(np.std(t)) + 1e-12
    norms = np.sqrt((basis * basis).sum(axis=1))
    return basis @ t / (sigma * norms)


SYNC_GATE = 5.0
"""Least sync correlation peak (in standard deviations of the correlation over every shift and both
mirror images) before refinement for a window to be decoded at all. Without a mark the highest of
those 32,768 correlations is about 4.1 +- 0.3 (median 4.15 over 10,000 varied unmarked frames, 1.5%
of them past the gate, the highest 6.7: docs/benchmarks/watermark_false_marks.md); marked windows
that decode start above 6. Below the gate a window is "no sync": cheaper (no refinement or
decoding), and one more condition a false mark must pass."""
REFINE = 2
"""Candidate lattices refined on the sync pattern per window."""
LIST_DECODE = 4
"""Distinct folds decoded per sum at most, highest sync peak first, until one passes (`_decode_sum`)."""


def _scaled(lat: Lattice, factor: float, degrees: float) -> Lattice:
    """`lat` scaled by `factor` and turned by `degrees`."""
    c, s = math.cos(math.radians(degrees)) * factor, math.sin(math.radians(degrees)) * factor

    def turn(v: tuple[float, float]) -> tuple[float, float]:
        return (c * v[0] - s * v[1], s * v[0] + c * v[1])

    return Lattice(turn(lat.v1), turn(lat.v2), lat.contrast)


MAX_CANDIDATES = 8
"""Lattices tried per window, likeliest first; the one whose fold matches the sync pattern best wins."""

MOTION_REKEY = 0.25
"""A frame becomes the motion reference when it has moved more than this share of the working frame's
shorter side from the current one: phase correlation needs the two to overlap mostly, and chaining
every frame instead would add each step's sub-pixel error (pan clip, 1.33 working px per frame:
OpenCV's phase correlation between neighbours gave 1.25, 0.08 short each step; the refined estimate
against one reference was 40.03 px after 30 frames, for 40)."""
MOTION_PAD = 0.5
"""Margin of the motion-registered canvas on every side, as a share of the working frame's shorter
side: a window's pan further than that is left out of the mean (and those parts are not cleaned).
Half the height in 2 s is a fast pan (the pan clip moves 40 working px in 1 s, then back)."""
MIN_MOTION_CHIPS = 2.0
"""Least spread of a window's frame positions, in chips, for the motion-compensated try: with less,
the static mark does not smear in the registered mean and subtracting the mean would take the mark
out with the picture (a still camera is what the plain sum is for). The chips alternate in sign, so
the mark is uncorrelated with itself one chip away; two chips leave room for that."""
OUTLIER_SIGMAS = 4.0
"""Robust standard deviations (from the median absolute value) beyond which a pixel of the cleaned sum
is dropped as something that stays put in the frame (`_Motion.cleaned` has the measurements)."""
MIN_COVER = 0.5
"""Share of a window's frames that must have seen a canvas pixel for its mean to be subtracted: where
few did, the mean is mostly the frame itself, mark included. At half, the pan clip's 2 s window
(a 40 px pan on the 427 px working frame) keeps 79% of its pixels, and its sync after the upload
encode is 14 standard deviations (the plain sum's was 5)."""


def _xcorr_shift(ref_conj: np.ndarray, r: np.ndarray) -> np.ndarray:
    """(dx, dy) by which `r` is the reference moved, to a fraction of a pixel: the cyclic
    cross-correlation's highest value and a parabola through its neighbours. `ref_conj` is the
    conjugate rfft2 of the windowed reference."""
    h, w = r.shape
    c = np.fft.irfft2(ref_conj * np.fft.rfft2(r), s=(h, w))
    j = int(np.argmax(c))
    py, px = divmod(j, w)

    def offset(l: float, m: float, rr: float) -> float:
        den = l - 2 * m + rr
        return 0.0 if den >= 0 else float(np.clip(0.5 * (l - rr) / den, -0.5, 0.5))

    ox = offset(c[py, px - 1], c[py, px], c[py, (px + 1) % w])
    oy = offset(c[py - 1, px], c[py, px], c[(py + 1) % h, px])
    return np.array([(px if px < w // 2 else px - w) + ox, (py if py < h // 2 else py - h) + oy])


def _translate(img: np.ndarray, dx: float, dy: float, size: tuple[int, int], border: int,
               interpolation: int = cv2.INTER_CUBIC) -> np.ndarray:
    """`img` moved by (dx, dy) onto a (width, height) = `size` plane."""
    m = np.float32([[1, 0, dx], [0, 1, dy]])
    return cv2.warpAffine(img, m, size, flags=interpolation, borderMode=border)


@dataclass
class _Motion:
    """The global motion of a window's pictures, and their motion-registered sum (see the module doc,
    "Moving camera"). Memory: a canvas of (1 + 2 MOTION_PAD)^2 working frames, twice."""

    shape: tuple[int, int]
    pad: int = 0
    acc: np.ndarray | None = None
    cover: np.ndarray | None = None
    positions: list[tuple[float, float]] | None = None
    _window: np.ndarray | None = None
    _ref: np.ndarray | None = None
    _ref_pos: np.ndarray | None = None

    def add(self, r: np.ndarray) -> None:
        h, w = self.shape
        if self.acc is None:
            self.pad = int(math.ceil(MOTION_PAD * min(h, w)))
            self.acc = np.zeros((h + 2 * self.pad, w + 2 * self.pad), np.float64)
            self.cover = np.zeros_like(self.acc)
            self.positions = []
            # A Hann window keeps the frame's edges (where the picture wraps around) out of the
            # correlation.
            self._window = cv2.createHanningWindow((w, h), cv2.CV_32F)
        assert self.cover is not None and self.positions is not None and self._window is not None
        if self._ref is None or self._ref_pos is None:
            pos = np.zeros(2)
            self._ref, self._ref_pos = np.conj(np.fft.rfft2(r * self._window)), pos
        else:
            d = _xcorr_shift(self._ref, r * self._window)
            # Two corrections on the frame moved back by the estimate: the parabola is biased towards
            # whole pixels (1.25 px for a true 1.33), and exact near zero.
            for _ in range(2):
                back = _translate(r, -d[0], -d[1], (w, h), cv2.BORDER_REFLECT)
                d = d + _xcorr_shift(self._ref, back * self._window)
            pos = self._ref_pos + d
            if np.hypot(*d) > MOTION_REKEY * min(h, w):
                self._ref, self._ref_pos = np.conj(np.fft.rfft2(r * self._window)), pos
        self.positions.append((float(pos[0]), float(pos[1])))
        size = (self.acc.shape[1], self.acc.shape[0])
        self.acc += _translate(r, self.pad - pos[0], self.pad - pos[1], size, cv2.BORDER_CONSTANT)
        self.cover += _translate(np.ones((h, w), np.float32), self.pad - pos[0], self.pad - pos[1], size,
                                 cv2.BORDER_CONSTANT, cv2.INTER_NEAREST)

    def spread(self) -> float:
        """Largest distance (working pixels) of a frame's position from the window's mean position."""
        if not self.positions:
            return 0.0
        p = np.asarray(self.positions)
        return float(np.max(np.hypot(*(p - p.mean(axis=0)).T)))

    def cleaned(self, total: np.ndarray) -> np.ndarray:
        """`total` (the plain sum of this window's residuals) less the motion-registered mean at each
        frame's place, and 0 wherever some frame's place in the canvas was seen by fewer than MIN_COVER
        of the frames. Those are the strips along the frame's edges that the pan brings in or takes
        out: their picture is not removed, adds up like the plain sum's, and its autocorrelation put
        false lattice peaks above the mark's. Measured on the pan clip, upload then 480p re-encode:
        kept, the sum's rms was 3.7, the top lattice false (76 px, not 107) and the sync 4.1; zeroed,
        rms 1.1 and sync 11.9 (decoded). On the upload alone, sync 10.9 kept, 14.3 zeroed."""
        assert self.acc is not None and self.cover is not None and self.positions is not None
        h, w = self.shape
        n = len(self.positions)
        seen = self.cover >= MIN_COVER * n
        mean = np.where(seen, self.acc / np.maximum(self.cover, 1.0), 0.0).astype(np.float32)
        seen32 = seen.astype(np.float32)
        background = np.zeros((h, w), np.float64)
        everywhere = np.ones((h, w), bool)
        for x, y in self.positions:
            background += _translate(mean, x - self.pad, y - self.pad, (w, h), cv2.BORDER_CONSTANT)
            everywhere &= _translate(seen32, x - self.pad, y - self.pad, (w, h), cv2.BORDER_CONSTANT,
                                     cv2.INTER_NEAREST) > 0.5
        out = np.where(everywhere, total - background, 0.0)
        # What stays put in the frame while the picture moves is not removed either: the black corners
        # of a turned frame, a logo, a misregistered edge. It adds up like the mark, but much larger
        # than the mark's share of a pixel, so pixels far out in the tails are dropped, with the
        # 2-pixel reach of the residual's high-pass around them. Pan clip, +-5 degree turn: rms 5.0
        # and 2.6 before, 0.9 after, sync 4.0 -> 10.9 and 3.6 -> 10.7, decoded; the upload alone
        # 14.3 -> 14.1. Thresholds of 3 to 6 robust deviations all decoded those; at 4, 11-16% of the
        # kept pixels go.
        kept = out != 0
        if np.any(kept):
            sigma = 1.4826 * float(np.median(np.abs(out[kept])))      # the normal spread, from the MAD
            wild = cv2.dilate((np.abs(out) > OUTLIER_SIGMAS * sigma).astype(np.uint8), np.ones((5, 5), np.uint8))
            out[wild > 0] = 0.0
        return out


@dataclass
class WindowDetector:
    """Accumulates frames (luma planes of one size) and decodes them together.

    Frames of a window share their geometry (a crop or a rescale applies to the whole clip), and the
    mark is the same in every frame, so the residuals are summed as they come: the mark adds up
    coherently, moving picture content does not. The lattice is then read from the autocorrelation
    of the sum, and the folded tile of the sum decides. When that fails and the picture moved (a pan),
    the sum less the motion-registered mean of the window is tried (module doc, "Moving camera").
    Memory: one working-size frame, and the motion canvas (4 working frames at MOTION_PAD 0.5)."""

    total: np.ndarray | None = None
    frames: int = 0
    shape: tuple[int, int] | None = None
    motion: _Motion | None = None
    box: tuple[slice, slice] | None = None
    """The picture inside bars (`picture_box`), fixed by the window's first frame: every frame's
    residual must have one size to be summed, and bars do not move within a clip."""
    picture: tuple[int, int] | None = None
    """The size of the picture inside the bars, which the detector reads."""

    def add(self, luma: np.ndarray) -> None:
        if luma.ndim != 2:
            raise ValueError(f"luma must be a 2-D array, got shape {tuple(luma.shape)}")
        if self.shape is not None and luma.shape != self.shape:
            raise ValueError(f"every frame of a window must have one size: {self.shape}, then {luma.shape}")
        self.shape = (int(luma.shape[0]), int(luma.shape[1]))
        if self.box is None:
            self.box = picture_box(luma)
        luma = luma[self.box]
        self.picture = (int(luma.shape[0]), int(luma.shape[1]))
        r32 = _residual(luma)
        r = r32.astype(np.float64)
        self.total = r if self.total is None else self.total + r
        self.frames += 1
        if min(self.picture) >= MIN_DETECT_SIDE:
            if self.motion is None:
                self.motion = _Motion((int(r32.shape[0]), int(r32.shape[1])))
            self.motion.add(r32)

    def __len__(self) -> int:
        return self.frames

    def decode(self) -> "DetectionV2":
        tries = self.tries()
        found = [t for t in tries if t.found]
        return found[0] if found else tries[0]

    def tries(self) -> list["DetectionV2"]:
        """What each sum gave, in the order `decode` tries them: the plain sum, then (on a moving
        picture, when the plain sum did not decode) the motion-cleaned sum. `decode` returns the first
        that decoded, else the plain sum's result; a diagnostic wants both
        (tools/watermark_payload_sweep.py)."""
        def miss(why: str) -> list[DetectionV2]:
            return [DetectionV2(Detection(False, None, 0.0, np.zeros(CODED_BITS), why), None, None, self.frames)]

        if self.total is None or self.picture is None:
            return miss("no frames")
        if min(self.picture) < MIN_DETECT_SIDE:
            return miss("frame too small")
        plain = self._decode_sum(self.total)
        if plain.found or self.motion is None:
            return [plain]
        chip = WORK_SIDE / CHIPS_PER_SIDE
        if self.motion.spread() < MIN_MOTION_CHIPS * chip:
            return [plain]
        # The autocorrelation squares the mark where the sync match does not: on a moving camera's
        # cleaned sum it is the first stage to lose the mark (pan clip, 0.5x rescale then re-encode:
        # no lattice candidate near the tile, but the sync on the unattacked lattice stood 8.6
        # standard deviations out, with the weaker mask before dac0555). A rescale, a flip or a
        # re-encode keeps that lattice on the working frame, so it is always tried here; the
        # refinement then covers a small turn or crop.
        moving = self._decode_sum(self.motion.cleaned(self.total), with_nominal=True)
        return [plain, dataclasses.replace(moving, path="motion")]

    def _decode_sum(self, total: np.ndarray, with_nominal: bool = False) -> "DetectionV2":
        """Look for the mark in one sum of residuals; `with_nominal` also tries the unattacked frame's
        lattice, whether or not the autocorrelation shows it."""
        nominal = TILE * WORK_SIDE / CHIPS_PER_SIDE  # the tile period of an unattacked frame
        candidates = lattice_candidates(_autocorr(total.astype(np.float32)), nominal)[:MAX_CANDIDATES]
        if with_nominal:
            candidates.append(Lattice((nominal, 0.0), (0.0, nominal), 0.0))
        if not candidates:
            return DetectionV2(Detection(False, None, 0.0, np.zeros(CODED_BITS), "no lattice"), None, None,
                               self.frames)
        scored = sorted((self._try(total, lat) for lat in candidates), key=lambda t: -t[1].peak)
        if scored[0][1].peak < SYNC_GATE:
            return DetectionV2(Detection(False, None, 0.0, np.zeros(CODED_BITS), "no sync"), scored[0][0],
                               scored[0][1], self.frames)
        # The autocorrelation places a peak to a fraction of a pixel, but 1% of scale is already a
        # chip of drift four tiles away: the best two are refined on the sync pattern itself.
        seen: list[tuple[Lattice, Alignment, np.ndarray]] = list(scored)
        for t in scored[:REFINE]:
            seen.extend(self._refine(total, *t))
        # A window at the edge of decoding reads the same mark through lattices a fraction of a pixel
        # apart, and which of them the CRC accepts is close to chance (pan clip, 0.5x, a keyframe-less
        # window of stream id 0x8a21412f: the folds with the two highest sync peaks failed, the third
        # passed, all within 0.6% in scale and 0.06 in sync peak). The LIST_DECODE best distinct
        # folds are decoded in turn (the refinement tries a lattice again when it steps back, and two
        # refinements can meet). Every try must pass the sync gate, the CRC and MIN_SCORE, so false
        # marks are at most LIST_DECODE times as common as with one try; 1.5% of unmarked frames pass
        # the gate, and none of 10,000 gave a mark (docs/benchmarks/watermark_false_marks.md).
        ranked = sorted(seen, key=lambda t: -t[1].peak)
        first: DetectionV2 | None = None
        tried: set[tuple[float, ...]] = set()
        for lat, al, tile in ranked:
            if al.peak < SYNC_GATE or len(tried) == LIST_DECODE:
                break
            # 0.01 px: the same lattice (a scale step and its way back land 1e-3 px apart; distinct
            # neighbours are 0.2 px apart, a refinement's smallest step at this tile size).
            key = tuple(round(v, 2) for v in (*lat.v1, *lat.v2))
            if key in tried:
                continue
            tried.add(key)
            got = DetectionV2(decode_soft(soft_from_tile(tile, al)), lat, al, self.frames)
            if got.found:
                return got
            if first is None:
                first = got
        assert first is not None  # ranked[0] is scored[0] or better, which passed the gate
        return first

    @staticmethod
    def _try(total: np.ndarray, lat: Lattice) -> tuple[Lattice, Alignment, np.ndarray]:
        sums, counts = _fold(total, lat)
        tile = sums / np.sqrt(np.maximum(counts, 1.0))
        return lat, align(tile), tile

    def _refine(self, total: np.ndarray, lat: Lattice, al: Alignment,
                tile: np.ndarray) -> list[tuple[Lattice, Alignment, np.ndarray]]:
        """Coordinate search on the lattice's scale and angle for the highest sync peak; every fold
        it tried, for list decoding."""
        best = (lat, al, tile)
        tried: list[tuple[Lattice, Alignment, np.ndarray]] = []
        for step_s, step_a in ((0.006, 0.6), (0.002, 0.2)):
            for _ in range(4):
                moved = False
                for ds, da in ((step_s, 0.0), (-step_s, 0.0), (0.0, step_a), (0.0, -step_a)):
                    cand = self._try(total, _scaled(best[0], 1.0 + ds, da))
                    tried.append(cand)
                    if cand[1].peak > best[1].peak:
                        best, moved = cand, True
                if not moved:
                    break
        return tried


@dataclass(frozen=True)
class DetectionV2:
    """What a window of frames gave."""

    detection: Detection
    lattice: Lattice | None
    alignment: Alignment | None
    frames: int
    path: str = "plain"
    """Which sum gave it: `plain` (the window's sum) or `motion` (the sum less its motion-registered
    mean, `WindowDetector`'s second try)."""

    @property
    def found(self) -> bool:
        return self.detection.found


def detect_v2(lumas: list[np.ndarray] | np.ndarray) -> DetectionV2:
    """Look for a v2 mark in one luma plane or a list of them (one window, one size)."""
    d = WindowDetector()
    for y in ([lumas] if isinstance(lumas, np.ndarray) and lumas.ndim == 2 else lumas):
        d.add(y)
    return d.decode()
