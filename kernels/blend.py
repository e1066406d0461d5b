"""Alpha blending of a swapped region back into its frame."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp


def blend_into(frame: Any, fg: Any, mask: Any, origin: tuple[int, int]) -> Any:
    """In place: frame[roi] = frame[roi] * (1 - mask) + fg * mask, rounded to uint8.

    frame: HxWx3 uint8; fg: hxwx3 float32 in [0, 255]; mask: hxw float32 in [0, 1]; origin: (x0, y0)
    of the region in the frame. The region may hang over the frame's edge: only the part inside the
    frame is touched, and pixels where mask == 0 keep their exact value.
    """
    check_array("frame", frame, ndim=3, dtype=np.uint8)
    check_array("fg", fg, ndim=3, dtype=np.float32)
    check_array("mask", mask, ndim=2, dtype=np.float32, shape=tuple(fg.shape[:2]))
    xp = get_xp(frame, fg, mask)
    H, W = frame.shape[:2]
    h, w = mask.shape
    x0, y0 = origin
    fx0, fy0 = max(x0, 0), max(y0, 0)
    fx1, fy1 = min(x0 + w, W), min(y0 + h, H)
    if fx1 <= fx0 or fy1 <= fy0:
        return frame
    sl = (slice(fy0 - y0, fy1 - y0), slice(fx0 - x0, fx1 - x0))
    m = mask[sl][..., None]
    roi = frame[fy0:fy1, fx0:fx1]
    mixed = roi.astype(xp.float32) + (fg[sl] - roi.astype(xp.float32)) * m
    frame[fy0:fy1, fx0:fx1] = xp.where(m > 0, xp.clip(xp.rint(mixed), 0, 255), roi).astype(xp.uint8)
    return frame
