"""The built-in face analysis (BlazeFace + Face Mesh) with its networks on the GPU.

Same tracking, ROI and smoothing logic as `face.analyser.FaceAnalyser`, which it subclasses; only the
networks and the pre-processing move. The `.tflite` files are executed by PyTorch
(`engines.tflite_torch`, CUDA graphs per batch size), the detector's letterbox runs as CuPy array ops
and the landmark crops as one `crop_batch` launch for all faces. Given a CuPy frame, nothing but the
model outputs (57 KB for a detection, 5.6 KB per face for landmarks) comes back to the host, where the
anchor decoding, NMS and ROI geometry run as on the CPU path.

Not on the GPU: the full-range detector. Its weights are stored sparse (the DENSIFY operator), which
the executor does not read; the short-range model is used for every detection, and the CPU path's
fallback to the other range when nothing is tracked does not exist here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import Config
from ..engines.builtin import builtin_model_path
from ..engines.tflite_torch import TfliteTorchRunner
from ..face.analyser import FaceAnalyser
from ..face.blazeface import SHORT_RANGE, BlazeFaceDetector
from ..face.facemesh import FaceMesh
from ..face.hands import PALM_KEYPOINTS, PALM_SPEC, HandLandmarker, HandTracker

log = logging.getLogger(__name__)

MAX_FACES_PER_CALL = 4
"""Landmark batch size: faces of one frame beyond this go in further calls."""


class GpuFaceAnalyser(FaceAnalyser):
    """`FaceAnalyser` on the GPU: `track` takes frames whose data is a CuPy (H, W, 3) uint8 array
    (NumPy frames also work, and are uploaded per call)."""

    def __init__(self, config: Config, models_dir: Path | None = None, *, device: str = "cuda",
                 mesh_batch: int | None = None) -> None:
        """`mesh_batch`: the most faces per landmark call (each size is a CUDA graph: `prepare`).
        By default as many as one frame can have, `detector.max_faces`, up to
        MAX_FACES_PER_CALL; `face.analyser.track_many` over many streams' trackers wants it as
        large as the faces it gathers."""
        self._device = device
        self._mesh_batch = mesh_batch or min(MAX_FACES_PER_CALL, config.detector.max_faces)
        if config.detector.model == "full_range":
            log.warning("the full-range detector cannot run on the GPU (sparse weights); "
                        "using the short-range model")
        super().__init__(config, models_dir)

    def _build_models(self, folder: Path) -> tuple[BlazeFaceDetector, BlazeFaceDetector | None, FaceMesh]:
        dc, compiled = self.config.detector, self.config.landmarks.compile
        short = BlazeFaceDetector(
            TfliteTorchRunner(builtin_model_path("face_detection_short_range.tflite", folder),
                              device=self._device, max_batch=1, compile=compiled),
            SHORT_RANGE, min_score=dc.min_score, nms_iou=dc.nms_iou)
        mesh = FaceMesh(TfliteTorchRunner(builtin_model_path("face_landmark.tflite", folder),
                                          device=self._device, max_batch=self._mesh_batch, compile=compiled))
        return short, None, mesh

    def _build_hands(self, folder: Path) -> HandTracker:
        """MediaPipe Hands for `mask.hands` on the GPU: both networks through the same executor
        (one hand per landmark call), the palm letterbox and the hand crop as CuPy launches."""
        mc, compiled = self.config.mask, self.config.landmarks.compile
        runner = lambda name: TfliteTorchRunner(builtin_model_path(name, folder), device=self._device,  # noqa: E731
                                                max_batch=1, compile=compiled)
        palm = BlazeFaceDetector(runner(f"palm_detection_{mc.hands_model}.tflite"), PALM_SPEC,
                                 keypoints=PALM_KEYPOINTS, unit_input=True)
        marker = HandLandmarker(runner(f"hand_landmark_{mc.hands_model}.tflite"))
        return HandTracker(palm, marker, max_hands=mc.max_hands, detect_every=mc.hands_detect_every)

    def prepare(self, most_faces: int | None = None) -> dict[str, list[int]]:
        """Capture every CUDA graph this analyser may use (the detector at batch 1, the landmark
        model at 1..`mesh_batch`, or its buckets with `landmarks.compile`) before the first live
        frame; returns the captured sizes. `most_faces` captures landmark batches up to that many
        faces only (more faces, when they come, are captured then).

        Warm-up frames alone do not reach every landmark batch size (they need that many tracked
        faces at once, and a frame whose face the warm-up swap has scrambled finds none); each size
        missed then cost a 2-3 s stall mid-stream on the H200 (docs/performance.md)."""
        mesh, det = self._mesh.runner, self._short.runner
        assert isinstance(mesh, TfliteTorchRunner) and isinstance(det, TfliteTorchRunner)  # _build_models
        most = self._mesh_batch if most_faces is None else max(1, min(most_faces, self._mesh_batch))
        built = {"landmarks": mesh.prepare(range(1, most + 1)), "detector": det.prepare([1])}
        if self._hands is not None:
            for key, r in (("palms", self._hands.palm.runner), ("hands", self._hands.landmarker.runner)):
                assert isinstance(r, TfliteTorchRunner)  # _build_hands
                built[key] = r.prepare([1])
        return built
