"""Detector pre- and post-processing (swapstream.neural.detect) against detectors with planted outputs.

The synthetic SCRFD and YOLOface models of tools/make_test_models.py ignore the image and emit faces
we choose, laid out exactly as the real models lay them out. Running them through ONNX Runtime and
the decoders must give those faces back in frame pixels, through the letterbox scale.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from swapstream.neural.detect import (decode_retinaface, decode_scrfd, decode_yoloface, letterbox_scale,
                                      nms, prepare_detector_input, scrfd_anchors, to_frame)

SIZE = 640




@pytest.fixture(scope="module")
def mtm() -> ModuleType:
    pytest.importorskip("onnx")
    from ..zoo_models import make_test_models

    return make_test_models


@pytest.fixture(scope="module")
def ort() -> ModuleType:
    return pytest.importorskip("onnxruntime")


def run(ort: ModuleType, model, tensor: np.ndarray) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"]
    return sess.run(None, {"input": tensor})


def kps_around(x: float, y: float) -> tuple[tuple[float, float], ...]:
    """Five key points near (x, y), on a quarter-pixel grid (exact in float32 and after / stride)."""
    return ((x - 10.25, y - 8.5), (x + 10.75, y - 8.0), (x + 0.5, y + 2.25), (x - 7.0, y + 12.5),
            (x + 7.25, y + 12.75))


def planted_faces(mtm: ModuleType, for_yolo: bool) -> tuple[list, list]:
    """Five faces, each drawn from the anchor nearest its centre; returns (planted, expected kept).

    B and C overlap (IoU ~0.87): NMS keeps B, the better one. D scores below the 0.5 threshold.
    Expected order: best score first.
    """
    F = mtm.PlantedFace
    a = F(stride=8, row=10, col=12, anchor=0 if for_yolo else 1, score=0.875,
          box=(80.5, 60.25, 120.75, 110.0), kps=kps_around(96.0, 80.0))
    b = F(stride=16, row=16, col=15, score=0.8125, box=(200.0, 200.0, 300.0, 320.0),
          kps=kps_around(250.0, 260.0))
    c = F(stride=32, row=8, col=8, score=0.6875, box=(204.0, 198.0, 302.0, 318.0),
          kps=kps_around(252.0, 258.0))
    d = F(stride=16, row=30, col=30, score=0.3125, box=(440.0, 450.0, 520.0, 530.0),
          kps=kps_around(480.0, 490.0))
    e = F(stride=32, row=5, col=17, score=0.75, box=(500.25, 120.5, 590.0, 230.75),
          kps=kps_around(544.0, 176.0))
    return [a, b, c, d, e], [a, b, e]


def expected(faces: list, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame-pixel boxes, scores and key points, computed independently of the module under test."""
    boxes = np.array([f.box for f in faces], np.float64)
    kps = np.array([f.kps for f in faces], np.float64)
    if scale != 1.0:
        boxes, kps = (boxes + 0.5) / scale - 0.5, (kps + 0.5) / scale - 0.5
    return boxes, np.array([f.score for f in faces]), kps


def random_frame(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# -- letterbox -------------------------------------------------------------------------------------

def test_small_frame_is_pasted_top_left_in_bgr() -> None:
    frame = random_frame(200, 300)
    tensor, scale = prepare_detector_input(frame, SIZE, "scrfd")
    assert scale == 1.0 and tensor.shape == (1, 3, SIZE, SIZE) and tensor.dtype == np.float32
    assert tensor.flags.c_contiguous
    bgr = frame[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_array_equal(tensor[0, :, :200, :300], (bgr - 127.5) / 128.0)
    assert (tensor[0, :, 200:, :] == -127.5 / 128.0).all() and (tensor[0, :, :, 300:] == -127.5 / 128.0).all()
    rgb, _ = prepare_detector_input(frame, SIZE, "yoloface", channel_order="rgb")
    np.testing.assert_array_equal(rgb[0, :, :200, :300], frame.transpose(2, 0, 1) / np.float32(255.0))
    assert not rgb[0, :, 200:, :].any()


def test_large_frame_is_shrunk_by_one_scale() -> None:
    h, w = 960, 1600
    frame = np.empty((h, w, 3), np.uint8)
    frame[:] = (10, 120, 250)
    y0, y1, x0, x1 = 300, 500, 700, 1000
    frame[y0:y1, x0:x1] = (200, 30, 90)
    tensor, scale = prepare_detector_input(frame, SIZE, "yoloface")
    assert scale == pytest.approx(0.4) and scale == letterbox_scale(h, w, SIZE)
    nh, nw = 384, 640
    img = tensor[0]
    assert not img[:, nh:, :].any()
    # Far from the patch the canvas holds the background colour exactly (BGR, / 255).
    np.testing.assert_allclose(img[:, 5, 5], np.array([250, 120, 10]) / 255.0, atol=1e-6)
    np.testing.assert_allclose(img[:, nh - 1, nw - 1], np.array([250, 120, 10]) / 255.0, atol=1e-6)
    # The patch's centre of mass lands where the frame -> canvas map puts it.
    diff = np.abs(img[0, :nh, :nw] - 250 / 255.0)
    ys, xs = np.mgrid[:nh, :nw]
    cy, cx = (ys * diff).sum() / diff.sum(), (xs * diff).sum() / diff.sum()
    fy, fx = (y0 + y1 - 1) / 2, (x0 + x1 - 1) / 2   # patch centre in frame pixels
    assert cx == pytest.approx((fx + 0.5) * scale - 0.5, abs=0.05)
    assert cy == pytest.approx((fy + 0.5) * scale - 0.5, abs=0.05)
    assert tuple(to_frame(np.array([cx, cy]), scale)) == pytest.approx((fx, fy), abs=0.15)


def test_prepare_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        prepare_detector_input(np.zeros((10, 10, 3), np.float32), SIZE, "scrfd")
    with pytest.raises(ValueError, match="family"):
        prepare_detector_input(np.zeros((10, 10, 3), np.uint8), SIZE, "yunet")
    with pytest.raises(ValueError, match="multiple of 32"):
        prepare_detector_input(np.zeros((10, 10, 3), np.uint8), 600, "scrfd")


# -- decoding through the synthetic detectors ------------------------------------------------------

@pytest.mark.parametrize("frame_hw", [(960, 1600), (480, 600)])
def test_scrfd_planted_faces_come_back_in_frame_pixels(mtm: ModuleType, ort: ModuleType,
                                                       frame_hw: tuple[int, int]) -> None:
    faces, kept = planted_faces(mtm, for_yolo=False)
    model = mtm.scrfd_synthetic(SIZE, mtm.plant_scrfd(SIZE, faces))
    tensor, scale = prepare_detector_input(random_frame(*frame_hw), SIZE, "scrfd")
    outputs = run(ort, model, tensor)
    assert [o.shape for o in outputs] == [(12800, 1), (3200, 1), (800, 1), (12800, 4), (3200, 4),
                                          (800, 4), (12800, 10), (3200, 10), (800, 10)]
    boxes, scores, kps = decode_scrfd(outputs, SIZE, scale, 0.5)
    want_boxes, want_scores, want_kps = expected(kept, scale)
    assert boxes.shape == (3, 4) and scores.shape == (3,) and kps.shape == (3, 5, 2)
    np.testing.assert_allclose(boxes, want_boxes, atol=1e-4, rtol=0)
    np.testing.assert_allclose(scores, want_scores, atol=1e-7, rtol=0)
    np.testing.assert_allclose(kps, want_kps, atol=1e-4, rtol=0)
    # Without NMS the overlapping face C is there too; the one below threshold never is.
    _, raw_scores, _ = decode_retinaface(outputs, SIZE, scale, 0.5, nms_iou=None)
    np.testing.assert_allclose(raw_scores, [0.875, 0.8125, 0.75, 0.6875])


def test_yoloface_planted_faces_come_back_in_frame_pixels(mtm: ModuleType, ort: ModuleType) -> None:
    faces, kept = planted_faces(mtm, for_yolo=True)
    model = mtm.yoloface_synthetic(SIZE, mtm.plant_yoloface(SIZE, faces))
    tensor, scale = prepare_detector_input(random_frame(1080, 1920), SIZE, "yoloface")
    assert scale == pytest.approx(1 / 3)
    outputs = run(ort, model, tensor)
    assert outputs[0].shape == (1, 20, 8400)
    boxes, scores, kps = decode_yoloface(outputs, SIZE, scale, 0.5)
    want_boxes, want_scores, want_kps = expected(kept, scale)
    np.testing.assert_allclose(boxes, want_boxes, atol=1e-4, rtol=0)
    np.testing.assert_allclose(scores, want_scores, atol=1e-7, rtol=0)
    np.testing.assert_allclose(kps, want_kps, atol=1e-4, rtol=0)


def test_decoders_accept_batched_outputs_and_reject_the_wrong_size(mtm: ModuleType) -> None:
    faces, kept = planted_faces(mtm, for_yolo=False)
    outputs = mtm.plant_scrfd(SIZE, faces)
    boxes, _, _ = decode_scrfd([o[None] for o in outputs], SIZE, 1.0, 0.5)
    np.testing.assert_allclose(boxes, expected(kept, 1.0)[0], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="detector size"):
        decode_scrfd(outputs, 320, 1.0, 0.5)
    with pytest.raises(ValueError, match="9 outputs"):
        decode_scrfd(outputs[:6], SIZE, 1.0, 0.5)
    with pytest.raises(ValueError, match="detector size"):
        decode_yoloface([mtm.plant_yoloface(SIZE, [])], 320, 1.0, 0.5)


def test_nothing_above_threshold_gives_empty_arrays(mtm: ModuleType) -> None:
    boxes, scores, kps = decode_scrfd(mtm.plant_scrfd(SIZE, []), SIZE, 0.5, 0.5)
    assert boxes.shape == (0, 4) and scores.shape == (0,) and kps.shape == (0, 5, 2)
    boxes, scores, kps = decode_yoloface([mtm.plant_yoloface(SIZE, [])], SIZE, 0.5, 0.5)
    assert boxes.shape == (0, 4) and scores.shape == (0,) and kps.shape == (0, 5, 2)


# -- pieces ----------------------------------------------------------------------------------------

def test_scrfd_anchor_order() -> None:
    a = scrfd_anchors(64, 16)                   # 4x4 cells, 2 anchors each
    assert a.shape == (32, 2)
    np.testing.assert_array_equal(a[:4], [[0, 0], [0, 0], [16, 0], [16, 0]])
    np.testing.assert_array_equal(a[8], [0, 16])  # second row starts at x = 0
    np.testing.assert_array_equal(a[-1], [48, 48])


def test_nms() -> None:
    boxes = np.array([[0, 0, 10, 10],           # kept: best
                      [1, 0, 11, 10],           # IoU 9/11 = 0.82 with 0: dropped
                      [20, 20, 30, 30],         # disjoint: kept
                      [0, 0, 10, 5],            # IoU 0.5 with 0: dropped at 0.4
                      [4, 0, 14, 10]], float)   # IoU 6/14 = 0.43 with 0: dropped at 0.4, kept at 0.45
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    assert nms(boxes, scores, 0.4).tolist() == [0, 2]
    assert nms(boxes, scores, 0.45).tolist() == [0, 2, 4]
    # Reversed scores: 4 leads; 3 overlaps it by 0.25 (kept), 1 by 0.54 and 0 by 0.43 (dropped).
    assert nms(boxes, scores[::-1].copy(), 0.4).tolist() == [4, 3, 2]
    # IoU equal to the threshold is kept (suppression is for IoU > threshold).
    assert nms(np.array([[0, 0, 10, 10], [0, 0, 10, 5]], float), np.array([0.9, 0.8]), 0.5).tolist() == [0, 1]
    # Equal scores keep input order.
    assert nms(np.array([[0, 0, 1, 1], [5, 5, 6, 6]], float), np.array([0.5, 0.5]), 0.4).tolist() == [0, 1]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.4).tolist() == []


def test_analysers_without_graphs_prepare_nothing(mtm: ModuleType) -> None:
    # A live job calls prepare() on whichever analyser it has before its first frame; only the GPU
    # analyser has something to build there (its CUDA graphs: tests/engines/test_tflite_torch.py).
    from swapstream.config import load_config
    from swapstream.engines.ort_runner import OnnxRuntimeRunner
    from swapstream.face.analyser import FaceAnalyser
    from swapstream.neural.analyser import DetectorAnalyser

    faces, _kept = planted_faces(mtm, for_yolo=False)
    model = mtm.scrfd_synthetic(SIZE, mtm.plant_scrfd(SIZE, faces))
    with OnnxRuntimeRunner(model.SerializeToString()) as runner:
        assert DetectorAnalyser(runner, "scrfd", SIZE).prepare() == {}
    cpu = FaceAnalyser(load_config())
    try:
        assert cpu.prepare() == {}
    finally:
        cpu.close()
