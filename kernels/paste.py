"""Fused paste-back of a neural swapper's output into the frame, in place.

`paste_back` does in one pass what FaceFusion does with two `cv2.warpAffine` calls and a blend
(docs/neural.md, "Masks and paste-back"): for every frame pixel in the bounding box of the crop, map it
into the crop through the inverse of the alignment matrix, bilinear-sample the swapped crop and the
box mask there, optionally colour-correct the sample, and blend `frame*(1-m) + crop*m`.

Conventions (as in warp.py): pixel centres at integer coordinates; `crop_to_frame` maps crop pixel
(x, y) to frame pixel coordinates (what alignment produced), and the op inverts it itself (in float64,
on the host, once per call).

Choices, shared by the reference and the kernels:

- The box mask is FaceFusion's `create_static_box_mask`: ones, each edge zeroed over
  max(blur_area, int(S * padding / 100)) pixels with blur_amount = int(S * 0.5 * blur) and
  blur_area = max(blur_amount // 2, 1) (so at least one pixel even with blur 0 and no padding), then
  a Gaussian blur with sigma = 0.25 * blur_amount when blur_amount > 0. The blur is `mask.gaussian_blur`:
  taps from `mask.gaussian_kernel` (radius ceil(3 sigma)) and borders REPLICATED, where FaceFusion's
  cv2.GaussianBlur uses radius ~4 sigma and BORDER_REFLECT_101. Away from the outermost ceil(3 sigma)
  rows and columns the two differ by < 5e-3 (from the kernel radius alone). In that outer band, reflection folds
  the ones beyond the zeroed band back onto the crop's edge, so FaceFusion's mask there is about twice
  ours (at S = 128, blur = 0.3: 0.073 against 0.036 at the edge; the tests pin the bounds). Replicating
  puts less weight on the crop's hard edge, i.e. a fainter seam. The blurred box is capped at 1, then
  multiplied by (1 - keep_out) where `keep_out` is given.
- The crop is sampled with its border replicated (FaceFusion warps it with BORDER_REPLICATE), the mask
  with a constant-0 border (cv2's default), and the sampled mask is clipped to [0, 1].
- The paste box is the bounding box of the crop's bilinear footprint, the corners (-1, -1) and (S, S)
  mapped into the frame: outside the open square (-1, S)^2 every mask tap is 0. floor(min) and
  ceil(max) of the mapped corners, clipped to the frame; x1, y1 are exclusive. (FaceFusion maps the
  corners (0, 0) and (S, S), which at scales above 1 can cut off the faint outer ring of a blurred
  mask.) Nothing outside the box is written, and inside it pixels whose mask sample is 0 keep their
  exact value.
- Colour correction, when `color_gain` or `color_offset` is given: rgb' = clip(rgb * gain[c] +
  offset[c], 0, 255) in float32 (a missing gain is 1, a missing offset 0).
- Rounding: to nearest, half to even (NumPy's rint, CUDA's rintf), then clipped to [0, 255]. (FaceFusion
  truncates with astype(uint8).)

Arithmetic: coordinates in float64 ((m00*x + m01*y) + m02), bilinear weights, mask, colour and blend in
float32, every operation rounded separately. The kernels in `cuda/paste.cu` use the `_rn` intrinsics,
which are never contracted into FMAs, so kernel and reference agree bit for bit.

GPU: three launches per call, all on the current stream: the mask's horizontal and vertical blur passes
(S x S each) and one fused sample + colour + blend kernel over the box.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ._xp import check_array, get_xp, on_gpu
from .mask import gaussian_blur
from .sharpen import Box, _check_frame, _check_real, _device_taps
from .warp import _sample_bilinear, invert_affine

Padding = tuple[float, float, float, float]


# ---------------------------------------------------------------------------------------------
# validation


def _check_padding(padding: Any) -> tuple[float, float, float, float]:
    try:
        vals = tuple(padding)
    except TypeError:
        raise ValueError(f"padding must be four numbers (top, right, bottom, left) in percent of the "
                         f"crop size, got {padding!r}") from None
    if (len(vals) != 4 or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)
                              or not math.isfinite(v) or not 0 <= v <= 100 for v in vals)):
        raise ValueError(f"padding must be four numbers in [0, 100] (top, right, bottom, left, in "
                         f"percent of the crop size), got {padding!r}")
    return tuple(float(v) for v in vals)  # type: ignore[return-value]


def _edges(size: int, blur: float, padding: Padding) -> tuple[float, tuple[int, int, int, int]]:
    """FaceFusion's box: the blur sigma and how many rows/columns are zeroed at (top, right, bottom,
    left), each clamped to the crop size. Same float64 expressions as create_static_box_mask."""
    blur_amount = int(size * 0.5 * blur)
    blur_area = max(blur_amount // 2, 1)
    zeroed = tuple(min(max(blur_area, int(size * p / 100)), size) for p in padding)
    return 0.25 * blur_amount, zeroed  # type: ignore[return-value]


def _check_box_mask(out: Any, blur: Any, padding: Any, keep_out: Any) -> tuple[float, Padding]:
    check_array("out", out, ndim=2, dtype=np.float32)
    if out.shape[0] != out.shape[1] or out.shape[0] < 1:
        raise ValueError(f"out must be a square SxS mask with S >= 1, got shape {tuple(out.shape)}")
    b = _check_real("blur", blur, minimum=0.0)
    pad = _check_padding(padding)
    if keep_out is not None:
        check_array("keep_out", keep_out, dtype=np.float32, shape=tuple(out.shape))
    return b, pad


def _check_color(name: str, v: Any) -> Any:
    if v is None:
        return None
    if type(v).__module__.startswith("cupy"):
        raise ValueError(f"{name} must be a NumPy array (its three values are passed to the kernel "
                         f"as arguments), got {type(v).__name__}")
    check_array(name, v, dtype=np.float32, shape=(3,))
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def _check_matrix(crop_to_frame: Any) -> np.ndarray:
    if type(crop_to_frame).__module__.startswith("cupy"):
        raise ValueError("crop_to_frame must be a NumPy array: the paste box is computed on the host, "
                         "and reading a CuPy matrix back would synchronise the stream")
    try:
        m = np.asarray(crop_to_frame, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"crop_to_frame must be a 2x3 affine matrix, got {crop_to_frame!r}") from None
    if m.shape != (2, 3) or not np.all(np.isfinite(m)):
        raise ValueError(f"crop_to_frame must be a finite 2x3 affine matrix, got shape {m.shape}")
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    scale = float(np.abs(m[:, :2]).max())
    if not abs(det) > 1e-9 * max(scale * scale, 1e-300):
        raise ValueError(f"crop_to_frame must be invertible, got determinant {det!r}")
    return m


def _check_paste(frame: Any, crop: Any, crop_to_frame: Any, blur: Any, padding: Any, keep_out: Any,
                 color_gain: Any, color_offset: Any) -> tuple[np.ndarray, Box, float, Padding]:
    """Validate; return the frame->crop matrix, the paste box, blur and padding."""
    _check_frame(frame)
    check_array("crop", crop, ndim=3, dtype=np.float32)
    s = crop.shape[0]
    if crop.shape[1] != s or crop.shape[2] != 3 or s < 1:
        raise ValueError(f"crop must have shape SxSx3 (RGB) with S >= 1, got {tuple(crop.shape)}")
    m = _check_matrix(crop_to_frame)
    b = _check_real("blur", blur, minimum=0.0)
    pad = _check_padding(padding)
    if keep_out is not None:
        check_array("keep_out", keep_out, dtype=np.float32, shape=(s, s))
    _check_color("color_gain", color_gain)
    _check_color("color_offset", color_offset)
    return invert_affine(m), paste_box(frame.shape, s, m), b, pad


def paste_box(frame_shape: tuple[int, ...], size: int, crop_to_frame: Any) -> Box:
    """The frame box (x0, y0, x1, y1), x1/y1 exclusive and clipped to the frame, that `paste_back`
    touches: the bounding box of the crop's bilinear footprint, corners (-1, -1) to (S, S), mapped by
    `crop_to_frame`. May be empty (x1 == x0 or y1 == y0) when the crop lies outside the frame."""
    h, w = int(frame_shape[0]), int(frame_shape[1])
    m = np.asarray(crop_to_frame, dtype=np.float64)
    c = np.array([[-1.0, -1.0], [size, -1.0], [size, size], [-1.0, size]])
    p = c @ m[:, :2].T + m[:, 2]
    lo = np.floor(p.min(axis=0))
    hi = np.ceil(p.max(axis=0))
    x0, x1 = (int(np.clip(v, 0, w)) for v in (lo[0], hi[0]))
    y0, y1 = (int(np.clip(v, 0, h)) for v in (lo[1], hi[1]))
    return (x0, y0, x1, y1)


# ---------------------------------------------------------------------------------------------
# box mask


def box_mask_ref(out: Any, *, blur: float = 0.3, padding: Padding = (0, 0, 0, 0),
                 keep_out: Any = None) -> Any:
    """Reference of `box_mask`, written against `xp`; same arguments."""
    b, pad = _check_box_mask(out, blur, padding, keep_out)
    xp = get_xp(out, keep_out)
    s = out.shape[0]
    sigma, (top, right, bottom, left) = _edges(s, b, pad)
    box = xp.ones((s, s), dtype=xp.float32)
    box[:top] = 0
    box[s - bottom:] = 0
    box[:, :left] = 0
    box[:, s - right:] = 0
    gaussian_blur(box, sigma, out)
    xp.minimum(out, xp.float32(1.0), out=out)
    if keep_out is not None:
        out *= 1 - keep_out
    return out


def box_mask(out: Any, *, blur: float = 0.3, padding: Padding = (0, 0, 0, 0),
             keep_out: Any = None) -> Any:
    """FaceFusion's box mask for an SxS crop, written into `out` (S, S) float32 and returned.

    blur:     FaceFusion's face_mask_blur (>= 0; default 0.3): sigma = 0.25 * int(0.5 * S * blur).
    padding:  (top, right, bottom, left) in percent of S, each in [0, 100].
    keep_out: optional (S, S) float32 in [0, 1]; the mask is multiplied by 1 - keep_out (1 keeps the
              target there, e.g. its mouth).

    See the module docstring for the border choice. A CuPy `out` runs two kernels (horizontal blur of
    the box into a scratch buffer, vertical blur + cap + keep_out) on the current stream; `keep_out`
    must then be a CuPy array too. A NumPy `out` runs `box_mask_ref`. The two agree bit for bit.
    """
    b, pad = _check_box_mask(out, blur, padding, keep_out)
    arrays = {"out": out} if keep_out is None else {"out": out, "keep_out": keep_out}
    if not on_gpu(**arrays):
        return box_mask_ref(out, blur=b, padding=pad, keep_out=keep_out)
    return _box_mask_cuda(out, b, pad, keep_out)


def _box_mask_cuda(out: Any, blur: float, padding: Padding, keep_out: Any) -> Any:
    import cupy

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("out", out)
    if keep_out is not None:
        require_cupy("keep_out", keep_out)
    s = out.shape[0]
    sigma, (top, right, bottom, left) = _edges(s, blur, padding)
    taps = _device_taps(sigma, cupy.cuda.runtime.getDevice())
    r = (int(taps.size) - 1) // 2
    scratch = cupy.empty((s, s), dtype=cupy.float32)
    n = s * s
    kernel("paste.cu", "box_mask_h_f32")(
        grid(n), (256,), (np.int32(s), np.int32(top), np.int32(right), np.int32(bottom),
                          np.int32(left), taps, np.int32(r), scratch))
    has_keep = keep_out is not None
    kernel("paste.cu", "box_mask_v_f32")(
        grid(n), (256,), (np.int32(s), taps, np.int32(r), scratch,
                          keep_out if has_keep else scratch, np.int32(has_keep), out))
    return out


# ---------------------------------------------------------------------------------------------
# paste-back


def paste_back_ref(frame: Any, crop: Any, crop_to_frame: Any, *, blur: float = 0.3,
                   padding: Padding = (0, 0, 0, 0), keep_out: Any = None, color_gain: Any = None,
                   color_offset: Any = None) -> Box:
    """Reference of `paste_back`, written against `xp`; same arguments and result."""
    inv, box, b, pad = _check_paste(frame, crop, crop_to_frame, blur, padding, keep_out, color_gain,
                                    color_offset)
    xp = get_xp(frame, crop, keep_out)
    s = crop.shape[0]
    mask = box_mask_ref(xp.empty((s, s), dtype=xp.float32), blur=b, padding=pad, keep_out=keep_out)
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return box
    gx = xp.arange(x0, x1, dtype=xp.float64)[None, :]
    gy = xp.arange(y0, y1, dtype=xp.float64)[:, None]
    sx = inv[0, 0] * gx + inv[0, 1] * gy + inv[0, 2]
    sy = inv[1, 0] * gx + inv[1, 1] * gy + inv[1, 2]
    m = _sample_bilinear(mask[..., None], sx, sy, "constant", 0.0)      # (h, w, 1) float32
    m = xp.clip(m, xp.float32(0.0), xp.float32(1.0))
    fg = _sample_bilinear(crop, sx, sy, "replicate", 0.0)               # (h, w, 3) float32
    if color_gain is not None or color_offset is not None:
        g = xp.asarray(np.ones(3, np.float32) if color_gain is None else color_gain)
        o = xp.asarray(np.zeros(3, np.float32) if color_offset is None else color_offset)
        fg = xp.clip(fg * g + o, xp.float32(0.0), xp.float32(255.0))
    roi = frame[y0:y1, x0:x1]
    f = roi.astype(xp.float32)
    mixed = f * (1 - m) + fg * m
    frame[y0:y1, x0:x1] = xp.where(m > 0, xp.clip(xp.rint(mixed), 0, 255), roi).astype(xp.uint8)
    return box


def paste_back(frame: Any, crop: Any, crop_to_frame: Any, *, blur: float = 0.3,
               padding: Padding = (0, 0, 0, 0), keep_out: Any = None, color_gain: Any = None,
               color_offset: Any = None) -> Box:
    """Blend a swapped face crop back into `frame`, in place; return the box it touched.

    frame:         (H, W, 3) uint8 RGB, modified in place, only inside the returned box.
    crop:          (S, S, 3) float32 RGB in [0, 255], the swapper's output at the model's resolution.
    crop_to_frame: 2x3 float64 affine (NumPy), crop pixel (x, y) -> frame pixel; inverted here.
    blur, padding: FaceFusion's face_mask_blur and face_mask_padding (top, right, bottom, left, % of S).
    keep_out:      optional (S, S) float32 in [0, 1], in crop pixels: the mask is multiplied by
                   1 - keep_out (1 keeps the target, e.g. its mouth).
    color_gain, color_offset: optional (3,) float32 NumPy arrays, RGB order: the crop's colour is
                   corrected to clip(rgb * gain + offset, 0, 255) before blending.

    Returns (x0, y0, x1, y1), x1/y1 exclusive, clipped to the frame (empty when the crop is off-frame);
    it is also the box to pass to `sharpen` afterwards.

    A CuPy `frame` needs `crop` and `keep_out` as C-contiguous CuPy arrays on the current device and
    runs three kernels on the current stream (mask blur passes, then one fused sample + colour + blend
    over the box); the (S, S) mask and its scratch come from CuPy's memory pool. A NumPy `frame` runs
    `paste_back_ref`. The two agree bit for bit.
    """
    inv, box, b, pad = _check_paste(frame, crop, crop_to_frame, blur, padding, keep_out, color_gain,
                                    color_offset)
    arrays = {"frame": frame, "crop": crop}
    if keep_out is not None:
        arrays["keep_out"] = keep_out
    if not on_gpu(**arrays):
        return paste_back_ref(frame, crop, crop_to_frame, blur=b, padding=pad, keep_out=keep_out,
                              color_gain=color_gain, color_offset=color_offset)
    return _paste_back_cuda(frame, crop, inv, box, b, pad, keep_out, color_gain, color_offset)


def _paste_back_cuda(frame: Any, crop: Any, inv: np.ndarray, box: Box, blur: float,
                     padding: Padding, keep_out: Any, color_gain: Any, color_offset: Any) -> Box:
    import cupy

    from .cuda_loader import grid, kernel, require_cupy

    require_cupy("frame", frame)
    require_cupy("crop", crop)
    if keep_out is not None:
        require_cupy("keep_out", keep_out)
    x0, y0, x1, y1 = box
    if x1 <= x0 or y1 <= y0:
        return box
    s = crop.shape[0]
    mask = _box_mask_cuda(cupy.empty((s, s), dtype=cupy.float32), blur, padding, keep_out)
    color = color_gain is not None or color_offset is not None
    gain = np.ones(3, np.float32) if color_gain is None else np.asarray(color_gain, np.float32)
    off = np.zeros(3, np.float32) if color_offset is None else np.asarray(color_offset, np.float32)
    bw, bh = x1 - x0, y1 - y0
    n = bw * bh
    kernel("paste.cu", "paste_back_u8")(
        grid(n), (256,),
        (frame, np.int32(frame.shape[1]), crop, mask, np.int32(s),
         *(np.float64(v) for v in inv.ravel()),
         np.int32(x0), np.int32(y0), np.int32(bw), np.int32(bh), np.int32(color),
         *(np.float32(v) for v in gain), *(np.float32(v) for v in off)))
    return box

