"""The occlusion-aware swap mask (issue 20) on the shipped portraits with synthetic occluders.

Targets are 720p frames of the demo clip (Grace Hopper, who already wears glasses and a cap) with an
occluder painted in front of the face; the source is the astronaut portrait. The checks are the
issue's: occluder pixels keep the target (PSNR >= 35 dB), the rest of the face is still swapped
(> 8 grey levels changed on average), and a still head does not flicker (<= 1.5 grey levels).
"""

from __future__ import annotations

from fractions import Fraction
from types import ModuleType

import cv2
import numpy as np
import pytest

from swapstream.config import Config, ConfigError, MaskConfig, MeshConfig, load_config
from swapstream.swap import occlusion as occ
from swapstream.swap.mesh import MeshSwapper
from swapstream.swap.occlusion import OcclusionMasker, SkinModel, fit_skin, fit_skin_robust, update_model
from swapstream.types import Face, Frame

from .measures import psnr
from .occluders import PAINTERS, hand

# Occluder pixels are judged two frame pixels in from the occluder's outline: the mask is built on
# a canvas of about 2 frame pixels a sample and softened over about one sample, so the outermost
# pixel of an occluder is a blend by design (as the swap's own feathered edge is).
_EDGE = 2


def interior(mask: np.ndarray) -> np.ndarray:
    k = np.ones((2 * _EDGE + 1, 2 * _EDGE + 1), np.uint8)
    return cv2.erode(mask.astype(np.uint8), k).astype(bool)


def swap_frame(frame: np.ndarray, face: Face, source: tuple[np.ndarray, Face],
               masker: OcclusionMasker | None, frames: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The mesh swap of one face with the occlusion mask applied as the swapper applies it
    (its paste mask times `visible`), `frames` times over (the mask's moving average settles);
    returns the last output frame and the frame-sized paste mask."""
    sw = MeshSwapper(MeshConfig(), occlusion=masker)
    sw.set_source(*source)
    for _ in range(frames):
        out = frame.copy()
        (r,) = sw.swap_regions(out, [face])
    full = np.zeros(frame.shape[:2], np.float32)
    x0, y0 = r.origin
    h, w = r.mask.shape
    full[y0:y0 + h, x0:x0 + w] = r.mask
    return out, full


# -- the skin model -----------------------------------------------------------------------------

def skin_samples(rng: np.random.Generator, n: int, mean=(205.0, 140.0, 105.0)) -> np.ndarray:
    a = np.array([[12.0, 0, 0], [8.0, 4.0, 0], [6.0, 2.0, 3.0]])  # correlated like shading
    return np.asarray(mean) + rng.normal(0, 1, (n, 3)) @ a.T


def test_skin_model_fits_and_measures() -> None:
    rng = np.random.default_rng()
    x = skin_samples(rng, 4000)
    m = fit_skin(x)
    assert m is not None
    # The trimmed refit drops the Gaussian's 3-sigma tail: the mean stays within a level.
    assert np.abs(m.mean - x.mean(axis=0)).max() < 1.0
    d = m.distance(x)
    # With the variance floors added, skin is well inside the ramp's start (3).
    assert np.median(d) < 1.5 and (d < 3.0).mean() > 0.97
    for far in ((40, 30, 25), (25, 25, 30), (140, 110, 95), (120, 160, 200)):  # hair, bar, hand, sky
        assert m.distance(np.array(far))[0] > 5.0, far
    assert fit_skin(x[:10]) is None


def test_skin_model_ignores_a_few_strands_in_the_sample() -> None:
    rng = np.random.default_rng()
    x = skin_samples(rng, 900)
    hair = np.array([45.0, 32.0, 26.0]) + rng.normal(0, 5, (100, 3))
    m = fit_skin(np.vstack([x, hair]))
    assert m is not None and np.abs(m.mean - x.mean(axis=0)).max() < 1.5


def test_robust_fit_ignores_a_covered_cheek() -> None:
    rng = np.random.default_rng()
    cheek_a, nose = skin_samples(rng, 400), skin_samples(rng, 150, (212.0, 138.0, 104.0))
    covered = np.array([140.0, 110.0, 95.0]) + rng.normal(0, 4, (450, 3))  # the largest region
    m = fit_skin_robust([covered, cheek_a, nose])
    assert m is not None and m.distance(np.array([205.0, 140.0, 105.0]))[0] < 1.0
    assert m.distance(np.array([140.0, 110.0, 95.0]))[0] > 5.0


def test_update_is_gated_and_relearns() -> None:
    rng = np.random.default_rng()
    m0 = fit_skin(skin_samples(rng, 800))
    hand_px = np.array([140.0, 110.0, 95.0]) + rng.normal(0, 4, (800, 3))
    m, misses = update_model(m0, 0, hand_px)
    assert m is m0 and misses == 1                     # one bad frame changes nothing
    # Half the samples covered: only the fitting half takes part.
    m, misses = update_model(m0, 0, np.vstack([skin_samples(rng, 500), hand_px[:400]]))
    assert misses == 0 and np.abs(m.mean - m0.mean).max() < 1.0
    # The light really changed: after enough frames that do not fit, the model is learned again.
    m, misses = m0, 0
    for _ in range(occ._RELEARN_AFTER + 1):
        m, misses = update_model(m, misses, hand_px)
    assert m.distance(np.array([140.0, 110.0, 95.0]))[0] < 1.0


def test_blend_is_the_mixture_moments() -> None:
    a = SkinModel(np.array([100.0, 80, 60]), np.eye(3) * 4)
    b = SkinModel(np.array([110.0, 80, 60]), np.eye(3) * 9)
    c = a.blend(b, 0.25)
    np.testing.assert_allclose(c.mean, [102.5, 80, 60])
    # Var = 0.75*4 + 0.25*9 + 0.25*0.75*10^2 on the channel that moved.
    np.testing.assert_allclose(np.diag(c.cov), [3 + 2.25 + 18.75, 5.25, 5.25])


# -- the mask on the portraits ------------------------------------------------------------------

def test_cv2_clean_matches_the_reference() -> None:
    from swapstream.kernels.occlusion import clean_occluder

    rng = np.random.default_rng()
    score = (rng.uniform(0, 1, (160, 160)) * (rng.random((160, 160)) < 0.4)).astype(np.float32)
    ref = clean_occluder(score, occ._GROW_PX, occ._CLEAN_SIGMA, np.empty_like(score))
    # Same median and dilation; the blur has the same taps summed in another order.
    np.testing.assert_allclose(OcclusionMasker._clean(score), ref, atol=1e-6, rtol=0)


def test_clean_face_is_mostly_visible(target, analyser) -> None:
    face = analyser.analyse_image(target)[0]
    m = OcclusionMasker(MaskConfig(), analyser.topology)
    x0, y0, w, h = MeshSwapper(MeshConfig()).region(face, target.shape)
    v = m.visible(target, face, (x0, y0, w, h))
    assert v.shape == (h, w) and v.dtype == np.float32
    assert 0.0 <= float(v.min()) and float(v.max()) <= 1.0
    # Grace Hopper's own cap brim and the dark upper rims of her glasses are occluders; her skin,
    # eyes, brows, lips and nose are not.
    lm = face.landmarks[:, :2]
    # The eyes' centres, and the middles of the upper and lower lip (landmarks 0/13 and 14/17:
    # outer and inner lip edge). The closed mouth's dark line between the lips is not skin; the
    # swapper keeps the target there anyway (mesh.keep_mouth).
    for ring in (analyser.topology.image_left_eye, analyser.topology.image_right_eye,
                 np.array([0, 13]), np.array([14, 17])):
        c = np.round(lm[ring].mean(axis=0)).astype(int)
        assert v[c[1] - y0, c[0] - x0] > 0.95, ring
    # The skin sample regions, as a whole. The nose's specular highlight (bright and grey) is a
    # known false positive of a colour model and pulls the nose region down a little.
    for ring, least in ((occ.CHEEK_IMAGE_LEFT, 0.95), (occ.CHEEK_IMAGE_RIGHT, 0.95),
                        (occ.NOSE_DORSUM, 0.85)):
        poly = np.zeros(v.shape, np.uint8)
        cv2.fillConvexPoly(poly, cv2.convexHull(np.round(lm[list(ring)] - [x0, y0]).astype(np.int32)), 1)
        assert np.median(v[poly > 0]) > least, ring
    assert float(v.mean()) > 0.75


@pytest.mark.parametrize("what", sorted(PAINTERS))
def test_occluders_keep_the_target(what: str, target, source, analyser) -> None:
    rng = np.random.default_rng(20)
    clean_face = analyser.analyse_image(target)[0]
    frame, mask = PAINTERS[what](target, clean_face.landmarks, analyser.topology, rng)
    face = analyser.analyse_image(frame)[0]   # the landmarks the product would see
    plain, paste = swap_frame(frame, face, source, None)
    out, _ = swap_frame(frame, face, source, OcclusionMasker(MaskConfig(), analyser.topology))
    inner = interior(mask) & (paste > 0.5)
    assert inner.sum() > 1000                 # the occluder is where the swap paints
    assert psnr(plain[inner], frame[inner]) < 25.0   # without the mask it is painted over
    assert psnr(out[inner], frame[inner]) >= 35.0
    face_px = (paste > 0.5) & ~cv2.dilate(mask.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    changed = np.abs(out[face_px].astype(float) - frame[face_px]).mean()
    assert changed > 8.0
    # Outside the paste region nothing moved.
    assert np.array_equal(out[paste == 0], frame[paste == 0])


def test_hand_arriving_over_a_cheek_is_found(target, source, analyser) -> None:
    """A hand that covers a cheek (a skin sample) after the track has learned the skin: the gate
    keeps it out of the model, and it is kept in front of the swap."""
    rng = np.random.default_rng(21)
    face = analyser.analyse_image(target)[0]
    face.track_id = 7
    masker = OcclusionMasker(MaskConfig(), analyser.topology)
    region = MeshSwapper(MeshConfig()).region(face, target.shape)
    for _ in range(5):
        masker.visible(target, face, region)
    learned = masker._tracks[7].skin
    frame, mask = hand(target, face.landmarks, analyser.topology, rng, side="cheek")
    _, paste = swap_frame(frame, face, source, None)
    for _ in range(4):   # the mask's moving average reaches ~94% in four frames at 0.5
        out, _ = swap_frame(frame, face, source, masker)
    inner = interior(mask) & (paste > 0.5)
    assert inner.sum() > 1000 and psnr(out[inner], frame[inner]) >= 35.0
    # The model follows the uncovered cheek a little, and never takes the hand in.
    now = masker._tracks[7].skin
    assert np.abs(now.mean - learned.mean).max() < 8.0
    assert now.distance(np.array([140.0, 110.0, 95.0]))[0] > 5.0


def test_a_still_head_does_not_flicker(target, source, analyser) -> None:
    """A static clip with sensor noise, tracked as a stream is: landmarks jitter a little and the
    colours of every frame differ, and the swapped region must still hold still."""
    rng = np.random.default_rng(22)
    clean_face = analyser.analyse_image(target)[0]
    still, _ = PAINTERS["fringe"](target, clean_face.landmarks, analyser.topology, rng)
    still, _ = PAINTERS["glasses"](still, clean_face.landmarks, analyser.topology, rng)
    outs: list[np.ndarray] = []
    masks = []
    vis: dict[float, list[np.ndarray]] = {0.5: [], 1.0: []}
    analyser.reset()
    try:
        sw = MeshSwapper(MeshConfig(), occlusion=OcclusionMasker(MaskConfig(), analyser.topology))
        sw.set_source(*source)
        raw = {a: OcclusionMasker(MaskConfig(occlusion_smoothing=a), analyser.topology) for a in vis}
        for i in range(12):
            noisy = np.clip(still + rng.normal(0, 2.0, still.shape), 0, 255).astype(np.uint8)
            (face,) = analyser.track(Frame(noisy, i, Fraction(1, 25), index=i))
            out = noisy.copy()
            (r,) = sw.swap_regions(out, [face])
            outs.append(out)
            masks.append(r)
            region = sw.region(face, noisy.shape)
            for a, m in raw.items():
                full = np.ones(noisy.shape[:2], np.float32)   # regions differ by a pixel or two
                x, y, w, h = region
                full[y:y + h, x:x + w] = m.visible(noisy, face, region)
                vis[a].append(full)
    finally:
        analyser.reset()
    x0, y0 = masks[0].origin
    h, w = masks[0].mask.shape
    sel = masks[0].mask > 0.5
    # From the second frame on (the first one starts every moving average).
    flicker = [np.abs(a[y0:y0 + h, x0:x0 + w][sel].astype(float) - b[y0:y0 + h, x0:x0 + w][sel]).mean()
               for a, b in zip(outs[1:], outs[2:])]
    # The moving average is what holds the mask still: without it the mask moves more, where it
    # is not simply 1 (near the occluders and the false positives).
    edge = np.stack(vis[1.0][1:]).min(axis=0) < 0.98
    def mask_motion(v: list[np.ndarray]) -> float:
        return float(np.mean([np.abs(p - q)[edge].mean() for p, q in zip(v[1:], v[2:])]))
    print(f"flicker of the swapped region: max {max(flicker):.2f}, mean {np.mean(flicker):.2f} grey "
          f"levels; mask motion {mask_motion(vis[0.5]):.4f} smoothed, {mask_motion(vis[1.0]):.4f} not")
    assert max(flicker) <= 1.5, flicker
    # Part of the motion is the landmarks' own (the mask must follow the face), which no average
    # removes; the noise-driven part it does: 0.75 of the unsmoothed motion with this seed.
    assert mask_motion(vis[0.5]) < 0.85 * mask_motion(vis[1.0])


def test_tracks_are_bounded_and_reset(target, analyser) -> None:
    face = analyser.analyse_image(target)[0]
    m = OcclusionMasker(MaskConfig(), analyser.topology)
    region = MeshSwapper(MeshConfig()).region(face, target.shape)
    for tid in range(occ._MAX_TRACKS + 5):
        face.track_id = tid
        m.visible(target, face, region)
    assert len(m._tracks) == occ._MAX_TRACKS and 0 not in m._tracks
    face.track_id = -1
    m.visible(target, face, region)           # a still image: no track kept
    assert -1 not in m._tracks
    m.reset()
    assert not m._tracks


def test_config_keys() -> None:
    cfg = Config()
    assert cfg.mask.occlusion is True
    assert load_config(overrides=["mask.occlusion=false"]).mask.occlusion is False
    with pytest.raises(ConfigError, match="mask.occlusion_threshold"):
        load_config(overrides=["mask.occlusion_threshold=0.5"])
    with pytest.raises(ConfigError, match="mask.occlusion_smoothing"):
        load_config(overrides=["mask.occlusion_smoothing=0"])


@pytest.mark.gpu
def test_gpu_mask_matches_cpu(cp: ModuleType, target, analyser) -> None:
    rng = np.random.default_rng()
    clean_face = analyser.analyse_image(target)[0]
    frame, _ = PAINTERS["glasses"](target, clean_face.landmarks, analyser.topology, rng)
    face = analyser.analyse_image(frame)[0]
    region = MeshSwapper(MeshConfig()).region(face, frame.shape)
    cpu = OcclusionMasker(MaskConfig(), analyser.topology).visible(frame, face, region)
    gpu = OcclusionMasker(MaskConfig(), analyser.topology).visible(cp.asarray(frame), face, region)
    assert isinstance(gpu, cp.ndarray)
    diff = np.abs(gpu.get() - cpu)
    # The CPU path resamples with OpenCV (5-bit interpolation weights, its own box average), the
    # GPU path with the generic kernels: the same mask up to those roundings.
    assert diff.mean() < 0.01 and diff.max() < 0.2


@pytest.mark.gpu
def test_gpu_swap_with_occlusion_matches_cpu(cp: ModuleType, target, source, analyser) -> None:
    rng = np.random.default_rng()
    clean_face = analyser.analyse_image(target)[0]
    frame, mask = PAINTERS["mouth_bar"](target, clean_face.landmarks, analyser.topology, rng)
    face = analyser.analyse_image(frame)[0]
    cpu, paste = swap_frame(frame, face, source, OcclusionMasker(MaskConfig(), analyser.topology))
    sw = MeshSwapper(MeshConfig(), occlusion=OcclusionMasker(MaskConfig(), analyser.topology))
    sw.set_source(*source)
    gpu = cp.asarray(frame)
    sw.swap(gpu, [face])
    got = gpu.get()
    sel = paste > 0
    # The plain GPU swap matches the CPU one at >= 40 dB (test_mesh_swap_gpu); the masks differ by
    # the resampling roundings above, on soft edges only.
    assert psnr(got[sel], cpu[sel]) >= 35.0
    # The occluder where the swap would paint without the mask (with it, the paste mask is near 0
    # there): the GPU output keeps the target, as the CPU one does (test_occluders_keep_the_target).
    _, plain_paste = swap_frame(frame, face, source, None)
    inner = interior(mask) & (plain_paste > 0.5)
    assert inner.sum() > 1000
    assert psnr(got[inner], frame[inner]) >= 35.0
