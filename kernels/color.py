"""Colour: sRGB <-> CIE L*a*b* (D65), masked statistics, and mean/std colour transfer."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._xp import check_array, get_xp

# sRGB (D65) to XYZ, with the white point folded in so that white maps to (1, 1, 1) before f().
_RGB2XYZ = np.array([[0.412453, 0.357580, 0.180423],
                     [0.212671, 0.715160, 0.072169],
                     [0.019334, 0.119193, 0.950227]], dtype=np.float64)
_WHITE = np.array([0.950456, 1.0, 1.088754], dtype=np.float64)
_M_FWD = (_RGB2XYZ / _WHITE[:, None]).astype(np.float32)
_M_INV = np.linalg.inv(_RGB2XYZ / _WHITE[:, None]).astype(np.float32)
_EPS = 216.0 / 24389.0
_KAPPA = 24389.0 / 27.0


def rgb_to_lab(rgb: Any, out: Any) -> Any:
    """RGB in [0, 255] (float32 or uint8, ...x3) to L* in [0, 100] and a*, b* (float32 ...x3)."""
    check_array("out", out, dtype=np.float32, shape=tuple(rgb.shape))
    xp = get_xp(rgb, out)
    c = rgb.astype(xp.float32) / 255.0
    lin = xp.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = lin @ xp.asarray(_M_FWD.T)
    f = xp.where(xyz > _EPS, xp.cbrt(xp.maximum(xyz, _EPS)), (_KAPPA * xyz + 16.0) / 116.0)
    out[..., 0] = 116.0 * f[..., 1] - 16.0
    out[..., 1] = 500.0 * (f[..., 0] - f[..., 1])
    out[..., 2] = 200.0 * (f[..., 1] - f[..., 2])
    return out


def lab_to_rgb(lab: Any, out: Any) -> Any:
    """Inverse of `rgb_to_lab`: float32 L*a*b* to float32 RGB in [0, 255] (clipped)."""
    check_array("lab", lab, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(lab.shape))
    xp = get_xp(lab, out)
    fy = (lab[..., 0] + 16.0) / 116.0
    fx = fy + lab[..., 1] / 500.0
    fz = fy - lab[..., 2] / 200.0
    f = xp.stack([fx, fy, fz], axis=-1)
    xyz = xp.where(f ** 3 > _EPS, f ** 3, (116.0 * f - 16.0) / _KAPPA)
    lin = xp.clip(xyz @ xp.asarray(_M_INV.T), 0.0, 1.0)
    c = xp.where(lin <= 0.0031308, 12.92 * lin, 1.055 * lin ** (1.0 / 2.4) - 0.055)
    out[...] = xp.clip(c * 255.0, 0.0, 255.0)
    return out


def masked_mean_std(img: Any, mask: Any, threshold: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of `img` (hxwxC) where `mask` (hxw) > threshold.

    Returns two host float64 arrays of length C; (zeros, ones) when no pixel is selected, which makes
    the colour transfer an identity.
    """
    check_array("img", img, ndim=3)
    check_array("mask", mask, ndim=2, shape=tuple(img.shape[:2]))
    xp = get_xp(img, mask)
    sel = mask > threshold
    n = int(sel.sum())
    c = img.shape[2]
    if n == 0:
        return np.zeros(c), np.ones(c)
    px = img[sel].astype(xp.float64)
    mean = px.mean(axis=0)
    std = px.std(axis=0)
    if xp is not np:
        mean, std = mean.get(), std.get()
    return np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)


def color_transfer(img: Any, src_stats: tuple[np.ndarray, np.ndarray],
                   dst_stats: tuple[np.ndarray, np.ndarray], out: Any, *, strength: float = 1.0,
                   min_std: float = 1.0) -> Any:
    """Move `img`'s per-channel statistics from `src_stats` towards `dst_stats` (Reinhard transfer).

    `strength` blends between no change (0) and a full match (1). Standard deviations are floored at
    `min_std` so that a flat source region cannot blow up the gain.
    """
    check_array("img", img, ndim=3, dtype=np.float32)
    check_array("out", out, dtype=np.float32, shape=tuple(img.shape))
    xp = get_xp(img, out)
    ms, ss = src_stats
    md, sd = dst_stats
    gain = np.maximum(sd, min_std) / np.maximum(ss, min_std)
    gain = 1.0 + strength * (gain - 1.0)
    target_mean = ms + strength * (md - ms)
    g = xp.asarray(gain.astype(np.float32))
    off = xp.asarray((target_mean - ms * gain).astype(np.float32))
    out[...] = img * g + off
    return out
