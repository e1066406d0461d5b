"""Hands in front of a face (`mask.hands`, face/hands.py): the region geometry against MediaPipe's
formulas, the real palm and hand landmark models on a hand painted in the target's own skin tone,
and the swap keeping that hand where the colour model alone paints over it."""

from __future__ import annotations

import math
from fractions import Fraction
from types import ModuleType

import cv2
import numpy as np
import pytest

from swapstream.config import Config, MaskConfig, MeshConfig, load_config
from swapstream.face.analyser import FaceAnalyser
from swapstream.face.blazeface import Detection
from swapstream.face.hands import (FINGERS, MIDDLE_BASE, WRIST, finger_width, hand_mask, hands_near,
                                   roi_from_hand, roi_from_palm, upright_angle)
from swapstream.swap.mesh import MeshSwapper
from swapstream.swap.occlusion import OcclusionMasker, occlusion_masker
from swapstream.types import Frame

from .measures import psnr
from .occluders import open_hand
from .test_occlusion import swap_frame

TILTS = (0.0, 15.0, -20.0)


def with_hands(config: Config, **mask: object) -> Config:
    return config.model_copy(update={"mask": config.mask.model_copy(update={"hands": True, **mask})})


@pytest.fixture(scope="module")
def hands_analyser(config: Config) -> FaceAnalyser:
    a = FaceAnalyser(with_hands(config, hands_detect_every=1))
    yield a
    a.close()


def upright_hand(rng: np.random.Generator, angle: float, centre: tuple[float, float] = (300.0, 200.0),
                 size: float = 100.0) -> np.ndarray:
    """21 landmarks of a plausible open hand, fingers up, rotated by `angle` (the crop rotation that
    brings it back upright) about the wrist, with a little jitter."""
    base = {WRIST: (0.0, 0.0)}
    for k, f in enumerate(FINGERS):
        x = -0.45 + 0.22 * k if k else -0.45
        for j, i in enumerate(f):
            base[i] = (x + (0.1 * j if k == 0 else 0.0), -0.35 - 0.2 * j - (0.25 if k else 0.0))
    pts = np.array([base[i] for i in range(21)]) * size + rng.normal(0, 0.5, (21, 2))
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])   # crop -> frame, as Roi.crop_to_frame rotates
    xy = pts @ rot.T + np.asarray(centre)
    return np.hstack([xy, np.zeros((21, 1))]).astype(np.float32)


# -- geometry -----------------------------------------------------------------------------------

@pytest.mark.parametrize("deg", [0.0, 30.0, -75.0, 150.0, -179.0])
def test_upright_angle_brings_the_vector_up(deg: float) -> None:
    a = math.radians(deg)
    up_in_frame = np.array([math.sin(a), -math.cos(a)])   # the crop's up (0, -1), rotated by a
    got = upright_angle(np.zeros(2), 50.0 * up_in_frame)
    assert abs(math.remainder(got - a, 2 * math.pi)) < 1e-9


@pytest.mark.parametrize("deg", [0.0, 35.0, -120.0])
def test_region_from_landmarks_holds_the_hand_and_keeps_its_rotation(deg: float) -> None:
    rng = np.random.default_rng()
    lm = upright_hand(rng, math.radians(deg))
    roi = roi_from_hand(lm)
    xy = lm[:, :2].astype(np.float64)
    top = ((xy[5] + xy[13]) / 2 + xy[9]) / 2
    assert abs(math.remainder(roi.angle - upright_angle(xy[0], top), 2 * math.pi)) < 1e-9
    # Every landmark inside the region, with some room to move: in crop coordinates, 5% in.
    m = roi.crop_to_frame(224)
    inv = np.linalg.inv(np.vstack([m, [0, 0, 1]]))[:2]
    crop = xy @ inv[:, :2].T + inv[:, 2]
    assert crop.min() > 0.05 * 224 and crop.max() < 0.95 * 224
    # The region is 2 times the long side of the tracked subset's box in the hand's rotation.
    sub = xy[[0, 1, 2, 3, 5, 6, 9, 10, 13, 14, 17, 18]]
    c, s = math.cos(roi.angle), math.sin(roi.angle)
    upright = sub @ np.array([[c, s], [-s, c]]).T
    assert roi.size == pytest.approx(2.0 * np.ptp(upright, axis=0).max())


def test_region_from_a_palm_is_shifted_towards_the_fingers() -> None:
    # A palm box 40 px square, wrist below the middle finger's base, rotated 90 degrees: the fingers
    # point to the image right, so the region moves right by half the box, and is 2.6 x 40 wide.
    det = Detection(np.array([80, 80, 120, 120], np.float32), 0.9,
                    np.array([[85, 100], [110, 90], [112, 100], [110, 110], [105, 115], [90, 115],
                              [95, 118]], np.float32))
    roi = roi_from_palm(det)
    assert roi.angle == pytest.approx(math.pi / 2)
    assert (roi.cx, roi.cy) == pytest.approx((120.0, 100.0))
    assert roi.size == pytest.approx(104.0)


def test_hand_mask_covers_the_bones_and_nothing_far_away() -> None:
    rng = np.random.default_rng()
    lm = upright_hand(rng, math.radians(rng.uniform(-40, 40)), size=60.0)
    m = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    mask = hand_mask([lm], m, (400, 600))
    xy = lm[:, :2].astype(np.float64)
    for f in FINGERS:   # every point along every bone is covered
        for a, b in zip(f[:-1], f[1:]):
            for t in np.linspace(0, 1, 9):
                x, y = np.rint(xy[a] + t * (xy[b] - xy[a])).astype(int)
                assert mask[y, x] == 1
    w = finger_width(lm)
    far = cv2.distanceTransform((1 - _bones(lm, (400, 600))).astype(np.uint8), cv2.DIST_L2, 5)
    assert not mask[far > w + 2].any()   # nothing beyond half a finger (plus rounding) off a bone
    # Drawn through a similarity transform (scaled 0.5, moved) it is the mask of the moved
    # landmarks: the transform reaches the widths as well as the points.
    sim = np.array([[0.5, 0.0, 10.0], [0.0, 0.5, 20.0]])
    moved = lm.copy()
    moved[:, :2] = lm[:, :2] @ sim[:, :2].T + sim[:, 2]
    half = hand_mask([lm], sim, (200, 300))
    assert half.sum() > 0 and np.mean(half != hand_mask([moved], np.eye(2, 3), (200, 300))) < 1e-3


def _bones(lm: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """1-pixel lines along the hand's bones and over its palm hull."""
    out = np.zeros(size, np.uint8)
    q = np.round(lm[:, :2]).astype(np.int32)
    cv2.fillConvexPoly(out, cv2.convexHull(q[[0, 1, 2, 5, 9, 13, 17]]), 1)
    for f in FINGERS:
        chain = [WRIST, *f] if f[0] == 1 else list(f)
        cv2.polylines(out, [q[chain]], False, 1, 1)
    return out


def test_hands_near_a_face() -> None:
    rng = np.random.default_rng()
    lm = upright_hand(rng, 0.0, centre=(300, 200), size=60)
    assert len(hands_near([lm], np.array([250, 100, 350, 250], np.float32))) == 1
    assert hands_near([lm], np.array([500, 100, 600, 250], np.float32)) == []


# -- the real models ----------------------------------------------------------------------------

@pytest.mark.parametrize("tilt", TILTS)
def test_models_find_a_hand_of_the_faces_own_skin_tone(tilt: float, target, hands_analyser) -> None:
    rng = np.random.default_rng(30)
    clean = hands_analyser.analyse_image(target)[0]
    frame, painted = open_hand(target, clean.landmarks, hands_analyser.topology, rng, tilt)
    hands_analyser.reset()
    faces = []
    for i in range(3):   # found by the palm detector, then followed
        faces = hands_analyser.track(Frame(frame, i, Fraction(1, 25), index=i))
    assert len(faces) == 1
    (lm,) = faces[0].extras["hands"]
    drawn = hand_mask([lm], np.array([[1.0, 0, 0], [0, 1.0, 0]]), frame.shape[:2]).astype(bool)
    inter = (drawn & painted).sum()
    # The outline from 21 landmarks and a fixed finger width against the painted hand: most of
    # each inside the other (the palm hull runs through joint centres; fingers are drawn 1.3x).
    assert inter > 0.85 * painted.sum() and inter > 0.7 * drawn.sum(), (inter, painted.sum(), drawn.sum())
    # The middle finger points where the painted one does (up, tilted by `tilt`).
    d = lm[12, :2] - lm[MIDDLE_BASE, :2]
    assert abs(math.degrees(math.atan2(d[0], -d[1])) - tilt) < 12.0


def test_a_palm_on_a_followed_hand_is_that_hand() -> None:
    """New palms are matched to followed hands by the wrist and middle-finger base keypoints (a
    box test fails when a spread thumb reaches over the neighbouring hand's palm)."""
    from swapstream.face.hands import _same_hand

    rng = np.random.default_rng()
    lm = upright_hand(rng, 0.3, centre=(300.0, 300.0), size=100.0)
    kp = np.zeros((7, 2), np.float32)
    kp[0], kp[2] = lm[WRIST, :2] + 5.0, lm[MIDDLE_BASE, :2] - 5.0
    assert _same_hand(Detection(np.array([250, 200, 350, 300], np.float32), 0.9, kp), lm)
    other = kp.copy()
    other[:, 0] += 90.0   # the neighbouring hand: its palm inside this hand's spread fingers' box
    assert not _same_hand(Detection(np.array([340, 200, 440, 300], np.float32), 0.9, other), lm)


def test_no_hand_in_the_clean_portraits(portraits, hands_analyser) -> None:
    for name, img in portraits.items():
        hands_analyser.reset()
        for i in range(2):
            faces = hands_analyser.track(Frame(img, i, Fraction(1, 25), index=i))
        assert faces and all(f.extras["hands"] == [] for f in faces), name


def test_hands_stay_off_by_default(config: Config, analyser: FaceAnalyser, target) -> None:
    assert config.mask.hands is False and analyser._hands is None
    analyser.reset()
    (face,) = analyser.track(Frame(target, 0, Fraction(1, 25), index=0))
    assert "hands" not in face.extras
    analyser.reset()


# -- the swap -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tilt", TILTS)
@pytest.mark.parametrize("colour", [True, False])
def test_swap_keeps_a_hand_of_the_faces_own_skin_tone(tilt: float, colour: bool, target, source,
                                                      hands_analyser) -> None:
    rng = np.random.default_rng(31)
    clean = hands_analyser.analyse_image(target)[0]
    frame, painted = open_hand(target, clean.landmarks, hands_analyser.topology, rng, tilt)
    hands_analyser.reset()
    for i in range(3):
        (face,) = hands_analyser.track(Frame(frame, i, Fraction(1, 25), index=i))
    face.track_id = 3
    _, paste = swap_frame(frame, face, source, None)
    # Two frame pixels in from the painted outline (the mask's soft edge, as in test_occlusion).
    inner = cv2.erode(painted.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool) & (paste > 0.5)
    assert inner.sum() > 3000                   # the hand is where the swap paints
    colour_only, _ = swap_frame(frame, face, source, OcclusionMasker(MaskConfig(), hands_analyser.topology), 4)
    # The colour model alone cannot tell this hand from the face: it is painted over.
    assert psnr(colour_only[inner], frame[inner]) < 25.0
    masker = occlusion_masker(MaskConfig(occlusion=colour, hands=True), hands_analyser.topology)
    out, _ = swap_frame(frame, face, source, masker, 4)
    assert psnr(out[inner], frame[inner]) >= 35.0
    face_px = (paste > 0.5) & ~cv2.dilate(painted.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    assert np.abs(out[face_px].astype(float) - frame[face_px]).mean() > 8.0   # the face still changed
    assert np.array_equal(out[paste == 0], frame[paste == 0])


def test_a_hand_that_leaves_fades_out_of_the_mask(target, source, hands_analyser) -> None:
    """Hands only (mask.occlusion off): once the hand is gone the kept region decays to nothing."""
    rng = np.random.default_rng(32)
    clean = hands_analyser.analyse_image(target)[0]
    frame, painted = open_hand(target, clean.landmarks, hands_analyser.topology, rng)
    masker = occlusion_masker(MaskConfig(occlusion=False, hands=True), hands_analyser.topology)
    assert masker is not None
    hands_analyser.reset()
    region = MeshSwapper(MeshConfig()).region(clean, target.shape)
    x, y, w, h = region
    for i, img in enumerate([frame] * 3 + [target] * 12):
        (face,) = hands_analyser.track(Frame(img, i, Fraction(1, 25), index=i))
        face.track_id = 5
        v = masker.visible(img, face, region)
        if i == 2:
            assert v[painted[y:y + h, x:x + w]].mean() < 0.2
    assert v.min() > 0.99 and face.extras["hands"] == []
    assert occlusion_masker(MaskConfig(occlusion=False, hands=False), hands_analyser.topology) is None


def test_trackers_share_the_hand_models(hands_analyser) -> None:
    t = hands_analyser.tracker()
    assert t._hands is not None and t._hands is not hands_analyser._hands
    assert t._hands.palm is hands_analyser._hands.palm
    t.close()   # a tracker leaves the shared models open
    assert hands_analyser._hands.palm.runner._interp is not None


def test_config_keys() -> None:
    cfg = load_config(overrides=["mask.hands=true", "mask.hands_model=full", "mask.hands_detect_every=5"])
    assert cfg.mask.hands and cfg.mask.hands_model == "full" and cfg.mask.hands_detect_every == 5
    from swapstream.config import ConfigError

    with pytest.raises(ConfigError, match="hands_model"):
        load_config(overrides=["mask.hands_model=huge"])


# -- the torch executor (what the GPU analyser runs) --------------------------------------------

def _torch_hands_against_litert(config: Config, target: np.ndarray, litert: FaceAnalyser, device: str,
                                tilt: float, upload: ModuleType | None = None) -> float:
    """The worst landmark distance between LiteRT's hand and GpuFaceAnalyser's (the hand models
    through the PyTorch executor on `device`; `upload` CuPy to give it device frames)."""
    from swapstream.gpu.analyser import GpuFaceAnalyser

    clean = litert.analyse_image(target)[0]
    frame, _ = open_hand(target, clean.landmarks, litert.topology, np.random.default_rng(33), tilt)
    ours = GpuFaceAnalyser(with_hands(config, hands_detect_every=1), device=device)
    try:
        if upload is not None:
            built = ours.prepare()
            assert built["palms"] == [1] and built["hands"] == [1]
        litert.reset()
        theirs = upload.asarray(frame) if upload is not None else frame
        for i in range(2):
            (want,) = litert.track(Frame(frame, i, Fraction(1, 25), index=i))
            (got,) = ours.track(Frame(theirs, i, Fraction(1, 25), index=i))
        (a,), (b,) = want.extras["hands"], got.extras["hands"]
        return float(np.abs(a[:, :2] - b[:, :2]).max())
    finally:
        ours.close()


def test_torch_hand_models_find_the_same_hand(config: Config, target, hands_analyser) -> None:
    """GpuFaceAnalyser's hand models through the PyTorch executor, on the CPU with NumPy frames:
    the same hand as LiteRT's, within a pixel."""
    pytest.importorskip("torch")
    # fp32 both, different convolution code (XNNPACK, oneDNN): sub-pixel differences.
    assert _torch_hands_against_litert(config, target, hands_analyser, "cpu", 15.0) < 1.0


@pytest.mark.gpu
def test_gpu_hand_models_on_cupy_frames(cp: ModuleType, config: Config, target, hands_analyser) -> None:
    """The same on the GPU: the palm letterbox and the hand crop as CuPy launches."""
    pytest.importorskip("torch")
    # The networks first: on the GPU, fed the CPU path's crops (host frames), they find LiteRT's
    # hand to a small fraction of a pixel (0.07 px on the H200; fp32, TF32 off).
    host_crops = _torch_hands_against_litert(config, target, hands_analyser, "cuda", -20.0)
    # Then the GPU's own crops. They are not rounded to uint8, and the letterbox samples its edge
    # rows by replication (blazeface.py): the palm's key points move by about 1.3 px, so the hand's
    # crop turns and scales a little, and the hand model, fed that crop, answers up to 2.3 px away on
    # the first frame and 4.6 px on the second. Those figures are the NumPy references of the GPU
    # kernels run on the CPU (crop_batch_ref and the letterbox's geometry), so they are what the
    # GPU must give: 2.76 px on the H200. 6 px is 2% of the hand, far inside the outline's dilation.
    on_device = _torch_hands_against_litert(config, target, hands_analyser, "cuda", -20.0, upload=cp)
    print(f"hand landmarks against LiteRT: GPU crops {on_device:.2f} px, host crops {host_crops:.2f} px")
    assert host_crops < 0.25
    assert on_device < 6.0
