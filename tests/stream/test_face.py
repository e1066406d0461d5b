"""Face analysis on the real public-domain portraits and on animated clips made from them."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from swapstream.config import load_config
from swapstream.demo import render_target_frame
from swapstream.face.analyser import FaceAnalyser, PendingTracks, track_many
from swapstream.face.blazeface import FULL_RANGE, SHORT_RANGE, ssd_anchor_centres
from swapstream.types import Frame


def test_anchor_counts_match_the_models() -> None:
    assert ssd_anchor_centres(SHORT_RANGE).shape == (896, 2)
    assert ssd_anchor_centres(FULL_RANGE).shape == (2304, 2)
    a = ssd_anchor_centres(SHORT_RANGE)
    # First layer: 16x16 cells, 2 anchors each, centred in their cells.
    np.testing.assert_allclose(a[0], [0.5 / 16, 0.5 / 16])
    np.testing.assert_allclose(a[1], a[0])
    np.testing.assert_allclose(a[512], [0.5 / 8, 0.5 / 8])


@pytest.mark.parametrize("name", ["astronaut", "grace_hopper"])
def test_one_face_with_five_points_in_order(name: str, portraits: dict[str, np.ndarray],
                                            analyser: FaceAnalyser) -> None:
    img = portraits[name]
    faces = analyser.analyse_image(img)
    assert len(faces) == 1
    f = faces[0]
    assert f.landmarks is not None and f.landmarks.shape == (468, 3)
    x1, y1, x2, y2 = f.box
    assert 0 <= x1 < x2 <= img.shape[1] and 0 <= y1 < y2 <= img.shape[0]
    # A real face box, not a sliver or the whole picture.
    assert 60 < x2 - x1 < 0.8 * img.shape[1]
    le, re, nose, lm, rm = f.kps
    for p in f.kps:
        assert x1 <= p[0] <= x2 and y1 <= p[1] <= y2
    assert le[0] < nose[0] < re[0]           # image-left eye, nose, image-right eye
    assert lm[0] < rm[0]                     # image-left mouth corner first
    assert max(le[1], re[1]) < nose[1] < min(lm[1], rm[1])  # eyes above nose above mouth


def test_detection_finds_no_face_in_a_face_free_picture(analyser: FaceAnalyser) -> None:
    yy, xx = np.mgrid[0:360, 0:480]
    img = np.stack([xx * 255 // 480, yy * 255 // 360, np.full_like(xx, 128)], -1).astype(np.uint8)
    assert analyser.analyse_image(img) == []


def clip_frames(portrait: np.ndarray, n: int, fps: int = 25, size: tuple[int, int] = (640, 360),
                still: bool = False, noise: float = 0.0, seed: int = 1) -> list[Frame]:
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n):
        img = render_target_frame(portrait, 0.0 if still else i / fps, size)
        if noise:
            img = np.clip(img + rng.normal(0, noise, img.shape), 0, 255).astype(np.uint8)
        frames.append(Frame(img, pts=i, time_base=Fraction(1, fps), index=i))
    return frames


def test_track_id_is_stable_through_motion(portraits: dict[str, np.ndarray]) -> None:
    a = FaceAnalyser(load_config(overrides=["detector.detect_every=3"]))
    ids = []
    for fr in clip_frames(portraits["grace_hopper"], 40, fps=10):
        faces = a.track(fr)
        assert len(faces) == 1
        ids.append(faces[0].track_id)
    a.close()
    assert len(set(ids)) == 1


def test_trackers_share_the_networks_and_keep_their_own_tracks(portraits: dict[str, np.ndarray]) -> None:
    # Two streams on one set of models, interleaved frame by frame: each tracker gives exactly what
    # an analyser of its own gives on its stream alone.
    cfg = load_config(overrides=["detector.detect_every=3"])
    streams = {name: clip_frames(portraits[name], 12, fps=10) for name in ("grace_hopper", "astronaut")}
    alone = {}
    for name, frames in streams.items():
        own = FaceAnalyser(cfg)
        alone[name] = [own.track(fr) for fr in frames]
        own.close()
    shared = FaceAnalyser(cfg)
    trackers = {name: shared.tracker() for name in streams}
    assert trackers["astronaut"]._mesh is shared._mesh and trackers["astronaut"]._tracks is not shared._tracks
    together: dict[str, list] = {name: [] for name in streams}
    for i in range(12):
        for name, frames in streams.items():
            together[name].append(trackers[name].track(frames[i]))
    for name in streams:
        for a, b in zip(alone[name], together[name]):
            assert [f.track_id for f in a] == [f.track_id for f in b]
            np.testing.assert_array_equal(a[0].landmarks, b[0].landmarks)
    # track_many: the same, with one landmark call for both streams per frame.
    batched = {name: shared.tracker() for name in streams}
    for i in range(12):
        names = list(streams)
        outs = track_many([(batched[n], streams[n][i]) for n in names])
        for n, faces in zip(names, outs):
            assert [f.track_id for f in faces] == [f.track_id for f in alone[n][i]]
            np.testing.assert_array_equal(faces[0].landmarks, alone[n][i][0].landmarks)
    # PendingTracks: the same frames in two halves give the same faces; a tracker takes one round
    # at a time, and a round finishes once.
    halves = {name: shared.tracker() for name in streams}
    for i in range(12):
        names = list(streams)
        pending = PendingTracks([(halves[n], streams[n][i]) for n in names])
        with pytest.raises(ValueError, match="one frame at a time"):
            PendingTracks([(halves[names[0]], streams[names[0]][i])])
        with pytest.raises(ValueError, match="one frame at a time"):
            halves[names[0]].track(streams[names[0]][i])
        outs = pending.finish()
        with pytest.raises(RuntimeError, match="twice"):
            pending.finish()
        for n, faces in zip(names, outs):
            assert [f.track_id for f in faces] == [f.track_id for f in alone[n][i]]
            np.testing.assert_array_equal(faces[0].landmarks, alone[n][i][0].landmarks)
    n0 = next(iter(streams))
    with pytest.raises(ValueError, match="one frame at a time"):
        PendingTracks([(halves[n0], streams[n0][0]), (halves[n0], streams[n0][1])])
    assert PendingTracks([]).finish() == []
    # A launch that fails leaves its trackers free; a round abandoned after launch keeps them busy
    # until reset().
    bad = Frame(np.zeros((4, 4), np.uint8), 0, Fraction(1, 30), 0)  # not an RGB frame: the crop fails
    with pytest.raises(ValueError, match="3 dimensions"):
        PendingTracks([(halves[n0], bad)])
    abandoned = PendingTracks([(halves[n0], streams[n0][0])])
    with pytest.raises(ValueError, match="one frame at a time"):
        halves[n0].track(streams[n0][0])
    del abandoned
    halves[n0].reset()
    assert len(halves[n0].track(streams[n0][0])) == 1
    other = FaceAnalyser(cfg)
    with pytest.raises(ValueError, match="tracker"):
        track_many([(batched["astronaut"], streams["astronaut"][0]), (other, streams["astronaut"][0])])
    other.close()
    trackers["astronaut"].close()  # a tracker's close leaves the shared models open
    assert len(shared.track(streams["astronaut"][0])) == 1
    shared.close()


def _jitter(cfg_overrides: list[str], frames: list[Frame]) -> float:
    a = FaceAnalyser(load_config(overrides=cfg_overrides))
    pts = []
    for fr in frames:
        faces = a.track(fr)
        assert len(faces) == 1 and faces[0].landmarks is not None
        pts.append(faces[0].landmarks[:, :2].copy())
    a.close()
    p = np.stack(pts[5:])  # after the filter has settled
    # Mean frame-to-frame landmark motion, in pixels: zero for a perfectly still mesh.
    return float(np.linalg.norm(np.diff(p, axis=0), axis=2).mean())


def test_smoothing_reduces_jitter_on_a_static_clip(portraits: dict[str, np.ndarray]) -> None:
    # A still head with sensor-like noise: every frame differs a little, the face does not move.
    frames = clip_frames(portraits["astronaut"], 30, still=True, noise=6.0)
    raw = _jitter(["smoothing.enabled=false"], frames)
    smooth = _jitter(["smoothing.enabled=true"], frames)
    assert raw > 0.05  # the noise really makes the raw mesh jitter
    assert smooth < 0.5 * raw


def test_opencv_inputs_match_the_numpy_reference(portraits: dict[str, np.ndarray]) -> None:
    """The CPU product path letterboxes the detector's input and crops the landmark model's with
    OpenCV (kernels/warp_cpu.py); the NumPy references they replace must give the same faces. The
    model inputs differ by at most a level of rounding at a few pixels: on 720p frames of both
    portraits the detections came out equal and the landmarks within 0.003 px, so the bounds here
    (0.05 px, 0.02 px) leave room for other CPUs' arithmetic, not for a different crop."""
    from swapstream.engines.builtin import builtin_model_path
    from swapstream.face.blazeface import BlazeFaceDetector
    from swapstream.face.facemesh import FaceMesh, roi_from_detection

    cfg = load_config()
    folder = cfg.models_dir
    frame = render_target_frame(portraits["grace_hopper"], 0.4, (1280, 720))
    model = builtin_model_path("face_detection_short_range.tflite", folder)
    fast, ref = BlazeFaceDetector(model, SHORT_RANGE), BlazeFaceDetector(model, SHORT_RANGE, reference=True)
    mesh_model = builtin_model_path("face_landmark.tflite", folder)
    mesh_fast, mesh_ref = FaceMesh(mesh_model), FaceMesh(mesh_model, reference=True)
    try:
        d_fast, d_ref = fast(frame), ref(frame)
        assert len(d_fast) == len(d_ref) == 1
        np.testing.assert_allclose(d_fast[0].box, d_ref[0].box, atol=0.05)
        np.testing.assert_allclose(d_fast[0].keypoints, d_ref[0].keypoints, atol=0.05)
        roi = roi_from_detection(d_ref[0], cfg.landmarks.roi_scale)
        (lm_fast, p_fast), (lm_ref, p_ref) = mesh_fast(frame, roi), mesh_ref(frame, roi)
        assert p_fast > 0.9 and p_ref > 0.9
        np.testing.assert_allclose(lm_fast[:, :2], lm_ref[:, :2], atol=0.02)
    finally:
        for r in (fast, ref, mesh_fast, mesh_ref):
            r.close()
