"""Occlusion-aware swap mask (issue 20): keep the target where something is in front of the face.

A hair fringe, glasses, a hand or a microphone in front of the target's face must stay in front of
the swapped face. Per face track, this module learns what the target's skin looks like from its own
cheeks and marks the pixels inside the face outline that do not look like it; the swapper multiplies
its paste mask by `OcclusionMasker.visible` so that those pixels keep the target.

Per face and frame, on a small square canvas that follows the face (similarity transform from the
landmarks: rotated with the eye line, scaled to the face outline), so that the cost does not depend
on the face's size in the frame and the temporal smoothing sees the same facial point in the same
canvas pixel while the head moves:

1. the face is resampled onto the canvas (box-averaged first when it is much larger, so that noise
   and texture do not alias);
2. the skin model (a Gaussian in YCrCb, fitted robustly to the pixels of both cheeks and the middle
   of the nose; at a track's first frame a sample region that disagrees with the others, a hand on
   a cheek, is left out) is updated slowly per track (an exponential moving average of its
   moments, gated: samples that do not fit the current model are left out, and a frame where most
   do not fit does not update it at all). The lips and the brows get models of their own the same
   way;
3. each canvas pixel's Mahalanobis distance to the skin model becomes a soft occluder score (a ramp
   from `mask.occlusion_threshold` standard deviations to three more), zero outside the face
   outline and over the eyes and nostrils (from the landmarks), which no colour model describes.
   Over the lips and brows a pixel is an occluder only if it is unlike the skin and unlike the
   lips (or brows) too: the target's own lips are not an occluder, a bar across them is;
4. the score is cleaned (3x3 median, one-pixel dilation, Gaussian blur: `kernels/occlusion.py`),
   averaged over time per track on the canvas, and warped back to the swap region.

The model's colour space: Mahalanobis distance is the same in any linear colour space, so YCrCb
matters only through the variance floors added to the fitted covariance, which are larger for luma
than for chroma: shading moves skin along luma far more than a hand, hair or a frame changes it in
chroma. A hand of the target's own skin tone is therefore the hard case and is not reliably found
by colour. `mask.hands` finds it another way: MediaPipe's hand models (face/hands.py) give each
hand's landmarks, the analyser hands them to the faces they meet (`Face.extras["hands"]`), and
their outline is drawn onto the canvas as an occluder score of 1, before the clean-up and the
moving average, so a hand fades in and out of the mask like any occluder. A hand also takes its
pixels out of the skin samples. With `mask.occlusion` off and `mask.hands` on, only hands count.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import cv2
import numpy as np

from ..config import MaskConfig
from ..face.hands import hand_mask
from ..face.topology import Topology
from ..kernels._xp import get_xp
from ..kernels.occlusion import (canvas_sample, clean_and_average, ema_update, occluder_part, occluder_score,
                                 visible_region)
from ..types import Face

# Face Mesh landmark groups (MediaPipe indices; "image left" is the subject's right, as in topology).
# Skin samples: the cheeks below the lower eyelid and the glasses' lower rim, beside the nose and
# above the smile fold's lower end, and the middle of the nose between a glasses bridge and the
# tip's highlight; the skin least often covered by hair, glasses or a beard.
CHEEK_IMAGE_LEFT: tuple[int, ...] = (123, 50, 36, 203, 206, 207, 187, 147)
CHEEK_IMAGE_RIGHT: tuple[int, ...] = (352, 280, 266, 423, 426, 427, 411, 376)
NOSE_DORSUM: tuple[int, ...] = (197, 419, 248, 281, 5, 51, 3, 196)
BROW_IMAGE_LEFT: tuple[int, ...] = (70, 63, 105, 66, 107, 55, 65, 52, 53, 46)
BROW_IMAGE_RIGHT: tuple[int, ...] = (300, 293, 334, 296, 336, 285, 295, 282, 283, 276)
# The underside of the nose: nostrils and the dark creases beside the alae.
NOSTRILS: tuple[int, ...] = (98, 97, 2, 326, 327, 294, 278, 344, 440, 275, 4, 45, 220, 115, 48, 64)

# Protected regions are grown about their centroid: the eyelid line, the lashes and the lip line
# lie just outside the landmark rings, and are as dark or red as any occluder.
_GROW = {"eye": 1.5, "brow": 1.25, "lips": 1.12, "nose": 1.1}

# Canvas side in pixels. At 160 a 720p face is sampled about every 2 frame pixels and a 1080p one
# every 3: a 6-pixel glasses frame still covers two canvas pixels, which the 3x3 median keeps.
CANVAS = 160
# The face outline's RMS radius maps to this fraction of the canvas half-side; an oval's farthest
# point is about 1.12 RMS radii out, so the outline fits with a small margin.
_FIT = 0.82

# BT.601 full-range RGB -> YCrCb (offsets dropped: the model is centred on its own mean).
_RGB_TO_YCC = np.array([[0.299, 0.587, 0.114],
                        [0.5, -0.418688, -0.081312],
                        [-0.168736, -0.331264, 0.5]], dtype=np.float64)
# Standard deviations added to the fitted ones (in 8-bit levels): luma for shading across the face
# (the cheeks see less of it than the forehead and jaw), chroma for the noise of a small sample.
_FLOOR_LUMA = 14.0
_FLOOR_CHROMA = 2.5
# The score ramps from the threshold to this many standard deviations beyond it.
_RAMP = 3.0
# Trimming and gating, in standard deviations: the chi distribution with 3 degrees of freedom puts
# 97% of a Gaussian's samples under 3.
_TRIM = 3.0
# Two skin samples (cheek, cheek, nose) whose models are further apart than this do not both show
# skin: at the first frame of a track, the pair that agrees best is used. (On the portraits here
# the nose and the cheeks of one clean face are 0.4-4 apart; a hand over a cheek 5-6.)
_AGREE = 4.5
# A lip model is used only if it looks like lips: its mean within this many of the skin model's
# standard deviations, and at least as red as the skin (Cr no more than `_LIPS_CR_SLACK` levels
# under it). A model learned from a bar or a hand over the mouth when the track began fails that,
# and the lips are left to the skin model alone, which keeps the target there (the safe side).
_LIPS_NEAR_SKIN = 10.0
_LIPS_CR_SLACK = 3.0
# The share of samples nearest the median that a fit starts from.
_CORE = 0.75
# Fewer sample pixels than this (a tiny or half-turned face) give no model update.
_MIN_PIXELS = 40
# A frame's samples update a model only when at least this fraction fits it; after this many
# frames in a row that do not, the model is learned again from scratch (the light changed).
_MIN_FIT_FRACTION = 0.5
_RELEARN_AFTER = 15
# Weight of a frame in the models' moving average: about 10 frames' memory.
_MODEL_ALPHA = 0.1
# Protected regions and the outline are blurred by this many canvas pixels before use.
_PROTECT_SIGMA = 1.5
# Clean-up of the score: dilation radius and blur, in canvas pixels.
_GROW_PX = 1
_CLEAN_SIGMA = 0.8
# Tracks remembered at once; the oldest is forgotten first (a face that left the picture).
_MAX_TRACKS = 32


@dataclass(frozen=True)
class SkinModel:
    """A Gaussian over the RGB colours (8-bit levels) of one part of one face: skin, lips, brows."""

    mean: np.ndarray
    """(3,) float64 mean RGB."""
    cov: np.ndarray
    """(3, 3) float64 covariance of RGB."""

    @cached_property
    def whitening(self) -> np.ndarray:
        """(3, 3) W such that W (rgb - mean) has unit covariance under the floored YCrCb model
        (computed once: the model is immutable)."""
        c = _RGB_TO_YCC @ self.cov @ _RGB_TO_YCC.T
        c += np.diag([_FLOOR_LUMA ** 2, _FLOOR_CHROMA ** 2, _FLOOR_CHROMA ** 2])
        return np.linalg.solve(np.linalg.cholesky(c), _RGB_TO_YCC)

    def distance(self, rgb: np.ndarray) -> np.ndarray:
        """Mahalanobis distance of (n, 3) RGB colours to the model, in standard deviations."""
        z = (np.asarray(rgb, np.float64).reshape(-1, 3) - self.mean) @ self.whitening.T
        return np.sqrt((z * z).sum(axis=1))

    def blend(self, other: SkinModel, alpha: float) -> SkinModel:
        """The moving average: moments of the mixture (1 - alpha) self + alpha other."""
        d = other.mean - self.mean
        mean = self.mean + alpha * d
        cov = (1.0 - alpha) * self.cov + alpha * other.cov + alpha * (1.0 - alpha) * np.outer(d, d)
        return SkinModel(mean, cov)


def fit_skin(rgb: np.ndarray) -> SkinModel | None:
    """A model from (n, 3) RGB samples, robust to a minority of other colours among them (strands
    of hair, a mole, a glasses rim): fitted to the `_CORE` of the samples nearest their per-channel
    median, then twice refitted to the samples within `_TRIM` standard deviations of the last fit.
    (A plain fit first would let 10% of dark hair stretch the luma variance until the hair passed
    the trim.) None if there are too few samples."""
    x = np.asarray(rgb, np.float64).reshape(-1, 3)
    if x.shape[0] < _MIN_PIXELS:
        return None
    near = np.argsort(((x - np.median(x, axis=0)) ** 2).sum(axis=1))[:max(_MIN_PIXELS, int(_CORE * len(x)))]
    model = SkinModel(x[near].mean(axis=0), np.cov(x[near], rowvar=False))
    for _ in range(2):
        inl = x[model.distance(x) < _TRIM]
        if inl.shape[0] < _MIN_PIXELS:
            break
        model = SkinModel(inl.mean(axis=0), np.cov(inl, rowvar=False))
    return model


def _apart(a: SkinModel, b: SkinModel) -> float:
    """How far two models are apart: each one's mean measured by the other, the larger."""
    return float(max(a.distance(b.mean)[0], b.distance(a.mean)[0]))


def fit_skin_robust(samples: list[np.ndarray]) -> SkinModel | None:
    """A skin model from sample regions of which one may be covered (a hand on a cheek when a track
    begins): all of them if they agree (the nose's shading and highlight widen the model, so that
    they are not taken for occluders); else the first two (the cheeks) if they agree; else the pair
    that agrees best; else the largest region alone."""
    models = [fit_skin(x) for x in samples]
    ok = [i for i, m in enumerate(models) if m is not None]
    if not ok:
        return None
    pairs = [(_apart(models[i], models[j]), i, j) for k, i in enumerate(ok) for j in ok[k + 1:]]
    if len(ok) == len(samples) and all(d < _AGREE for d, _, _ in pairs):
        return fit_skin(np.concatenate(samples))
    if 0 in ok and 1 in ok and _apart(models[0], models[1]) < _AGREE:
        return fit_skin(np.concatenate(samples[:2]))
    if pairs:
        d, i, j = min(pairs)
        if d < _AGREE:
            return fit_skin(np.concatenate([samples[i], samples[j]]))
    return models[max(ok, key=lambda i: len(samples[i]))]


def update_model(model: SkinModel | None, misfits: int, px: np.ndarray,
                 init: list[np.ndarray] | None = None) -> tuple[SkinModel | None, int]:
    """One frame's update of a per-track model: (model, frames in a row that did not fit).

    Without a model (or after `_RELEARN_AFTER` misfits) it is learned from `init` (sample regions
    for `fit_skin_robust`) or `px`. Otherwise only the samples within `_TRIM` of the model take
    part, and a frame where fewer than `_MIN_FIT_FRACTION` do leaves the model unchanged.
    """
    px = np.asarray(px, np.float64).reshape(-1, 3)
    if model is None or misfits >= _RELEARN_AFTER:
        fresh = fit_skin_robust(init) if init is not None else fit_skin(px)
        return (fresh, 0) if fresh is not None else (model, misfits)
    if px.shape[0] < _MIN_PIXELS:
        return model, misfits
    fits = px[model.distance(px) < _TRIM]
    if fits.shape[0] < max(_MIN_PIXELS, _MIN_FIT_FRACTION * px.shape[0]):
        return model, misfits + 1
    return model.blend(SkinModel(fits.mean(axis=0), np.cov(fits, rowvar=False)), _MODEL_ALPHA), 0


def _lips_plausible(lips: SkinModel, skin: SkinModel) -> bool:
    """Whether a lip model looks like lips next to this skin (see `_LIPS_NEAR_SKIN`)."""
    cr_lips, cr_skin = (_RGB_TO_YCC[1] @ m.mean for m in (lips, skin))
    return bool(skin.distance(lips.mean)[0] <= _LIPS_NEAR_SKIN and cr_lips >= cr_skin - _LIPS_CR_SLACK)


def canvas_transform(xy: np.ndarray, topo: Topology, size: int = CANVAS) -> np.ndarray:
    """2x3 float64 matrix from frame pixels to the face canvas: the outline's centroid at the
    centre, the eye line horizontal, the outline's RMS radius at `_FIT` of the half-side."""
    oval = xy[topo.face_oval].astype(np.float64)
    c = oval.mean(axis=0)
    e = xy[topo.image_right_eye].mean(axis=0) - xy[topo.image_left_eye].mean(axis=0)
    ang = math.atan2(float(e[1]), float(e[0]))
    cos, sin = math.cos(ang), math.sin(ang)
    rot = np.array([[cos, sin], [-sin, cos]])
    rms = float(np.sqrt((((oval - c) @ rot.T) ** 2).sum(axis=1).mean()))
    s = _FIT * (size / 2.0) / max(rms, 1.0)
    a = s * rot
    # Pixel centres are at integer coordinates: the canvas centre is at (size - 1) / 2.
    t = np.full(2, (size - 1) / 2.0) - a @ c
    return np.hstack([a, t[:, None]])


def _grown(pts: np.ndarray, factor: float) -> np.ndarray:
    c = pts.mean(axis=0)
    return (pts - c) * factor + c


def _fill(polys: list[np.ndarray], size: int, convex: bool = False) -> np.ndarray:
    """Polygons (canvas coordinates) filled into a size x size uint8 0/1 mask, with 1/16-pixel
    vertex precision so that sub-pixel landmark motion moves the edge smoothly."""
    m = np.zeros((size, size), np.uint8)
    for p in polys:
        q = np.round(p * 16.0).astype(np.int32)
        if convex:
            cv2.fillConvexPoly(m, cv2.convexHull(q), 1, cv2.LINE_8, shift=4)
        else:
            cv2.fillPoly(m, [q], 1, cv2.LINE_8, shift=4)
    return m


def _soft(mask: np.ndarray) -> np.ndarray:
    return np.minimum(cv2.GaussianBlur(mask.astype(np.float32), (0, 0), _PROTECT_SIGMA), 1.0)


def _bbox(polys: list[np.ndarray], size: int) -> tuple[slice, slice] | None:
    """The canvas box around polygons, padded by the soft edge's reach (3 sigma), or None if it is
    off the canvas."""
    pts = np.concatenate(polys)
    pad = int(math.ceil(3.0 * _PROTECT_SIGMA)) + 1
    lo = np.maximum(np.floor(pts.min(axis=0)).astype(int) - pad, 0)
    hi = np.minimum(np.ceil(pts.max(axis=0)).astype(int) + pad + 1, size)
    if (hi <= lo).any():
        return None
    return slice(int(lo[1]), int(hi[1])), slice(int(lo[0]), int(hi[0]))


@dataclass
class _Track:
    skin: SkinModel | None = None
    lips: SkinModel | None = None
    brows: SkinModel | None = None
    misfits: dict[str, int] | None = None
    """Per model: frames in a row whose samples did not fit it."""
    occluded: Any = None
    """(CANVAS, CANVAS) float32 moving average of the cleaned occluder score (NumPy or CuPy)."""


class OcclusionMasker:
    """Per-track occlusion masks for one stream's faces. Tracks are keyed by `Face.track_id`; a face
    without one (-1, a still image) gets a fresh model and no temporal smoothing."""

    def __init__(self, config: MaskConfig, topology: Topology) -> None:
        self.config = config
        self.topo = topology
        self._tracks: OrderedDict[int, _Track] = OrderedDict()
        self._samples = tuple(np.asarray(g) for g in (CHEEK_IMAGE_LEFT, CHEEK_IMAGE_RIGHT, NOSE_DORSUM))
        self._brows = (np.asarray(BROW_IMAGE_LEFT), np.asarray(BROW_IMAGE_RIGHT))
        # Never occluders: the eyes and the nostrils (no colour model describes an eye; sunglasses
        # and a finger under the nose are not found there). The inner mouth is not protected: teeth
        # and a dark mouth count as non-skin and keep the target, as mesh.keep_mouth does.
        self._fixed = [(topology.image_left_eye, _GROW["eye"]), (topology.image_right_eye, _GROW["eye"]),
                       (np.asarray(NOSTRILS), _GROW["nose"])]

    def reset(self) -> None:
        """Forget every track (a cut, a new stream)."""
        self._tracks.clear()

    def _track(self, track_id: int) -> _Track:
        if track_id < 0:
            return _Track()
        tr = self._tracks.get(track_id)
        if tr is None:
            tr = self._tracks[track_id] = _Track()
            while len(self._tracks) > _MAX_TRACKS:
                self._tracks.popitem(last=False)
        self._tracks.move_to_end(track_id)
        return tr

    def visible(self, frame: Any, face: Face, region: tuple[int, int, int, int]) -> Any:
        """(h, w) float32 over the swap region (x0, y0, w, h) of `frame` (HxWx3 uint8 RGB, NumPy or
        CuPy): 1 where the face is seen, down to 0 where something is in front of it."""
        assert face.landmarks is not None
        xp = get_xp(frame)
        x0, y0, w, h = region
        tr = self._track(face.track_id)
        xy = face.landmarks[:, :2].astype(np.float64)
        m = canvas_transform(xy, self.topo)
        # Hands in front of the face (mask.hands): their outlines from the hand landmarks, which
        # find a hand of the face's own skin tone that the colour model cannot.
        hands = (face.extras.get("hands") or []) if self.config.hands else []
        hand = hand_mask(hands, m, (CANVAS, CANVAS)) if hands else None
        score = self._colour_score(frame, tr, xy, m, hand, xp) if self.config.occlusion else None
        if hand is not None:
            # A hand is an occluder wherever it lies, over the eyes and lips too.
            hand_x = xp.asarray(hand, xp.float32)
            score = hand_x if score is None else xp.maximum(score, hand_x)
        if score is None:
            if tr.occluded is None:
                return xp.ones((h, w), xp.float32)   # nothing seen yet: the whole face is visible
            score = xp.zeros((CANVAS, CANVAS), xp.float32)   # what was seen fades out
        return self._smoothed(tr, score, m, x0, y0, w, h, xp)

    def _colour_score(self, frame: Any, tr: _Track, xy: np.ndarray, m: np.ndarray, hand: np.ndarray | None,
                      xp: Any) -> Any:
        """The canvas's occluder score from the track's colour models (learned from this frame
        first, a hand's pixels left out), or None before the skin model exists."""
        patch = self._canvas(frame, m, xp)
        q = xy @ m[:, :2].T + m[:, 2]

        # Masks on the canvas: where to look (the outline), what is never an occluder, and the lips
        # and brows, which are judged by their own colour models as well as the skin's.
        outline = _fill([q[self.topo.face_oval]], CANVAS)
        fixed = _fill([_grown(q[idx], g) for idx, g in self._fixed], CANVAS)
        lips = [_grown(q[self.topo.lips_outer], _GROW["lips"])]
        brows = [_grown(q[b], _GROW["brow"]) for b in self._brows]
        allow = outline * (1.0 - _soft(fixed))

        self._learn(tr, patch, q, xp, hand)
        if tr.skin is None:
            return None
        lo = self.config.occlusion_threshold
        allow_x = xp.asarray(allow, xp.float32)   # one upload on the GPU, for the parts too
        score = occluder_score(patch, allow_x, tr.skin.whitening, tr.skin.mean, lo,
                               lo + _RAMP, xp.empty((CANVAS, CANVAS), xp.float32))
        lip_model = tr.lips if tr.lips is not None and _lips_plausible(tr.lips, tr.skin) else None
        for polys, model in ((lips, lip_model), (brows, tr.brows)):
            box = _bbox(polys, CANVAS)
            if model is None or box is None:
                continue
            # Inside the part a pixel is an occluder only if it is unlike both the skin and the
            # part: the target's own lips and brows are not occluders, a bar across them is.
            origin = np.array([box[1].start, box[0].start], np.float64)
            part = _fill([p - origin for p in polys], CANVAS)[:box[0].stop - box[0].start,
                                                             :box[1].stop - box[1].start]
            # The box is padded by the blur's reach, so blurring inside it loses nothing.
            w_part = xp.asarray(_soft(part), xp.float32)
            occluder_part(patch, allow_x, model.whitening, model.mean, lo, lo + _RAMP, w_part,
                          (box[1].start, box[0].start), score)
        return score

    def _smoothed(self, tr: _Track, score: Any, m: np.ndarray, x0: int, y0: int, w: int, h: int,
                  xp: Any) -> Any:
        """The score cleaned, averaged into the track's mask over time, and sampled at the region."""
        fresh = tr.occluded is None or get_xp(tr.occluded) is not xp
        alpha = self.config.occlusion_smoothing
        if xp is not np:   # three fused launches (kernels/occlusion.py)
            if fresh:
                tr.occluded = xp.empty((CANVAS, CANVAS), xp.float32)
            clean_and_average(score, _GROW_PX, _CLEAN_SIGMA, tr.occluded, alpha, fresh)
        elif fresh:
            tr.occluded = self._clean(score)
        else:
            ema_update(tr.occluded, self._clean(score), alpha)
        return self._to_region(tr.occluded, m, x0, y0, w, h, xp)

    # -- steps ----------------------------------------------------------------------------------

    def _canvas(self, frame: Any, m: np.ndarray, xp: Any) -> Any:
        """The face resampled onto the canvas, box-averaged first by the integer factor the
        canvas shrinks it by (bilinear sampling alone would alias texture and noise)."""
        scale = math.hypot(m[0, 0], m[0, 1])
        k = int(1.0 / scale) if scale < 0.5 else 1
        # Frame area the canvas reads, in whole blocks of k.
        inv = np.linalg.inv(np.vstack([m, [0, 0, 1]]))[:2]
        corners = np.array([[0, 0, 1], [CANVAS, 0, 1], [0, CANVAS, 1], [CANVAS, CANVAS, 1]], float)
        fx = corners @ inv.T
        H, W = frame.shape[:2]
        bx0 = max(int(math.floor(fx[:, 0].min())) - k, 0) // k * k
        by0 = max(int(math.floor(fx[:, 1].min())) - k, 0) // k * k
        bx1 = min(int(math.ceil(fx[:, 0].max())) + k, W)
        by1 = min(int(math.ceil(fx[:, 1].max())) + k, H)
        bw, bh = (bx1 - bx0) // k, (by1 - by0) // k
        if bw < 2 or bh < 2:  # the face is (almost) out of the picture: replicate what there is
            k, bx0, by0, bw, bh = 1, 0, 0, W, H
        crop = frame[by0:by0 + bh * k, bx0:bx0 + bw * k]
        # Canvas -> crop-block coordinates: block centre (i, j) sits at frame ((i + 0.5) k - 0.5).
        to_block = np.array([[1.0 / k, 0, (-bx0 + 0.5) / k - 0.5],
                             [0, 1.0 / k, (-by0 + 0.5) / k - 0.5]])
        a = to_block @ np.vstack([inv, [0, 0, 1]])
        if xp is np:
            small = crop if k == 1 else cv2.resize(crop, (bw, bh), interpolation=cv2.INTER_AREA)
            return cv2.warpAffine(small, a, (CANVAS, CANVAS),
                                  flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                  borderMode=cv2.BORDER_REPLICATE)
        # One launch on the GPU (the box average and the warp fused, kernels/occlusion.py).
        return canvas_sample(xp.ascontiguousarray(frame), (bx0, by0), (bw, bh), k, a,
                             xp.empty((CANVAS, CANVAS, 3), xp.uint8))

    def _learn(self, tr: _Track, patch: Any, q: np.ndarray, xp: Any, hand: np.ndarray | None = None) -> None:
        """Update the track's skin, lip and brow models from this frame (see `update_model`),
        leaving out the pixels a hand covers (`hand`, a canvas mask)."""
        # The sample regions as labels of one image (they do not overlap): skin samples 1-3, the
        # lip band (outer ring grown, minus the mouth opening) 4, the brows 5.
        label = np.zeros((CANVAS, CANVAS), np.uint8)
        lips = np.round(_grown(q[self.topo.lips_outer], _GROW["lips"]) * 16).astype(np.int32)
        cv2.fillPoly(label, [lips], 4, cv2.LINE_8, shift=4)
        cv2.fillPoly(label, [np.round(q[self.topo.lips_inner] * 16).astype(np.int32)], 0,
                     cv2.LINE_8, shift=4)
        for k, g in enumerate(self._samples):
            hull = cv2.convexHull(np.round(q[g] * 16).astype(np.int32))
            cv2.fillConvexPoly(label, hull, k + 1, cv2.LINE_8, shift=4)
        cv2.fillPoly(label, [np.round(q[b] * 16).astype(np.int32) for b in self._brows], 5,
                     cv2.LINE_8, shift=4)
        if hand is not None:
            label[hand > 0] = 0
        idx = np.flatnonzero(label)
        idx = idx[np.argsort(label.ravel()[idx], kind="stable")]
        counts = np.bincount(label.ravel()[idx], minlength=6)[1:]
        flat = patch.reshape(-1, 3)
        # One gather (and on the GPU one copy to the host) of the few hundred sample pixels.
        got = np.asarray(flat[idx] if xp is np else flat[xp.asarray(idx)].get(), np.float64)
        parts = np.split(got, np.cumsum(counts)[:-1])
        if tr.misfits is None:
            tr.misfits = {"skin": 0, "lips": 0, "brows": 0}
        tr.skin, tr.misfits["skin"] = update_model(tr.skin, tr.misfits["skin"],
                                                   np.concatenate(parts[:3]), init=parts[:3])
        tr.lips, tr.misfits["lips"] = update_model(tr.lips, tr.misfits["lips"], parts[3])
        tr.brows, tr.misfits["brows"] = update_model(tr.brows, tr.misfits["brows"], parts[4])

    @staticmethod
    def _clean(score: np.ndarray) -> np.ndarray:
        # OpenCV's versions of the reference's steps (tests/stream/test_occlusion.py compares them):
        # the same median and dilation, and a blur with the reference's taps (radius ceil(3 sigma)).
        r = max(1, int(math.ceil(3.0 * _CLEAN_SIGMA)))
        out = cv2.medianBlur(score, 3)
        out = cv2.dilate(out, np.ones((2 * _GROW_PX + 1,) * 2, np.uint8))
        return cv2.GaussianBlur(out, (2 * r + 1, 2 * r + 1), _CLEAN_SIGMA,
                                borderType=cv2.BORDER_REPLICATE)

    @staticmethod
    def _to_region(occluded: Any, m: np.ndarray, x0: int, y0: int, w: int, h: int, xp: Any) -> Any:
        """1 - the canvas mask, sampled at the swap region's pixels (nothing occluded off-canvas)."""
        # Region pixel (u, v) is frame pixel (u + x0, v + y0), which is canvas m (x, y, 1).
        a = m.copy()
        a[:, 2] += m[:, :2] @ np.array([x0, y0], np.float64)
        if xp is np:
            occ = cv2.warpAffine(occluded, a, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                 borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
            return np.subtract(1.0, occ, out=occ)
        return visible_region(occluded, a, xp.empty((h, w), xp.float32))


def occlusion_masker(config: MaskConfig, topology: Topology) -> OcclusionMasker | None:
    """The masker a swapper of one stream (or one identity) gets: None when neither `mask.occlusion`
    nor `mask.hands` is on."""
    return OcclusionMasker(config, topology) if config.occlusion or config.hands else None
