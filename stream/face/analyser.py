"""Face analysis on the CPU: BlazeFace detection, Face Mesh landmarks, tracking and smoothing."""

from __future__ import annotations

import copy

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Config
from ..engines.builtin import builtin_model_path
from ..types import Face, Frame
from .blazeface import FULL_RANGE, SHORT_RANGE, BlazeFaceDetector, Detection, iou
from .facemesh import FaceMesh, Roi, roi_from_detection, roi_from_landmarks
from .hands import PALM_KEYPOINTS, PALM_SPEC, HandLandmarker, HandTracker, hands_near
from .smoothing import OneEuroFilter
from .topology import Topology, five_points, load_topology

log = logging.getLogger(__name__)

# A detection that overlaps a tracked face this much is that face, not a new one.
_SAME_FACE_IOU = 0.3


def landmark_box(landmarks: np.ndarray) -> np.ndarray:
    xy = landmarks[:, :2]
    return np.concatenate([xy.min(axis=0), xy.max(axis=0)]).astype(np.float32)


@dataclass
class _Track:
    track_id: int
    raw: np.ndarray
    """Unsmoothed landmarks of the last frame: the next ROI comes from these, so smoothing adds no lag
    to tracking."""
    presence: float
    smoother: OneEuroFilter | None
    det_score: float


class FaceAnalyser:
    """Finds faces with dense landmarks in still images (`analyse_image`) and video (`track`)."""

    def __init__(self, config: Config, models_dir: Path | None = None) -> None:
        self.config = config
        folder = models_dir or config.models_dir
        self._short, self._full, self._mesh = self._build_models(folder)
        self._hands: HandTracker | None = self._build_hands(folder) if config.mask.hands else None
        self.topology: Topology = load_topology()
        self._tracks: list[_Track] = []
        self._next_id = 0
        self._frames_seen = 0
        self._owns_models = True
        self._in_flight = False  # a PendingTracks round not yet finished (it owns the tracks)

    def tracker(self) -> FaceAnalyser:
        """Another analyser over the same networks, with tracks of its own: one per stream, one set
        of models (and, on the GPU, one set of CUDA graphs) however many streams there are. The
        models keep no state between calls, but they are not for several threads at once: use the
        trackers of one analyser from one thread. Closing a tracker leaves the models open."""
        other = copy.copy(self)
        other._tracks = []
        other._next_id = 0
        other._frames_seen = 0
        other._owns_models = False
        other._in_flight = False
        other._hands = self._hands.tracker() if self._hands is not None else None
        return other

    def _build_models(self, folder: Path) -> tuple[BlazeFaceDetector, BlazeFaceDetector | None, FaceMesh]:
        """The short- and full-range detectors and the landmark model, run by LiteRT on the CPU."""
        dc = self.config.detector
        short = BlazeFaceDetector(
            builtin_model_path("face_detection_short_range.tflite", folder), SHORT_RANGE,
            min_score=dc.min_score, nms_iou=dc.nms_iou, threads=dc.threads)
        full = BlazeFaceDetector(
            builtin_model_path("face_detection_full_range_sparse.tflite", folder), FULL_RANGE,
            min_score=max(dc.min_score, 0.6), nms_iou=dc.nms_iou, threads=dc.threads)
        return short, full, FaceMesh(builtin_model_path("face_landmark.tflite", folder), threads=dc.threads)

    def _build_hands(self, folder: Path) -> HandTracker:
        """MediaPipe Hands for `mask.hands`, run by LiteRT on the CPU."""
        mc, dc = self.config.mask, self.config.detector
        palm = BlazeFaceDetector(builtin_model_path(f"palm_detection_{mc.hands_model}.tflite", folder),
                                 PALM_SPEC, min_score=0.5, nms_iou=0.3, threads=dc.threads,
                                 keypoints=PALM_KEYPOINTS, unit_input=True)
        marker = HandLandmarker(builtin_model_path(f"hand_landmark_{mc.hands_model}.tflite", folder),
                                threads=dc.threads)
        return HandTracker(palm, marker, max_hands=mc.max_hands, detect_every=mc.hands_detect_every)

    # -- still images ---------------------------------------------------------------------------

    def detect(self, rgb: np.ndarray, *, both_ranges: bool = False) -> list[Detection]:
        """Detections with the configured model; with `both_ranges`, fall back to the other one."""
        first, second = ((self._full, self._short) if self.config.detector.model == "full_range"
                         else (self._short, self._full))
        if first is None:  # a backend without the full-range model
            first, second = second, None
        assert first is not None
        dets = first(rgb, self.config.detector.max_faces)
        if not dets and both_ranges and second is not None:
            dets = second(rgb, self.config.detector.max_faces)
        return dets

    def _landmarks(self, rgb: np.ndarray, roi: Roi) -> tuple[np.ndarray, float]:
        return self._mesh(rgb, roi)

    def _refine(self, rgb: np.ndarray, roi: Roi) -> tuple[np.ndarray, float]:
        """Landmarks from a detection ROI, then once more from the landmarks' own ROI.

        The detector's box is loose; the second pass, centred and rotated by the mesh itself, is what
        MediaPipe's tracking converges to, and makes a still image give the same mesh as a video.
        """
        scale = self.config.landmarks.roi_scale
        lm, p = self._landmarks(rgb, roi)
        if p >= self.config.landmarks.min_presence:
            lm, p = self._landmarks(rgb, roi_from_landmarks(lm, scale))
        return lm, p

    def _face(self, landmarks: np.ndarray, score: float, track_id: int) -> Face:
        return Face(box=landmark_box(landmarks), score=score,
                    kps=five_points(landmarks, self.topology), landmarks=landmarks,
                    track_id=track_id)

    def analyse_image(self, rgb: np.ndarray) -> list[Face]:
        """All faces of a still image, largest first. No tracking state is touched."""
        scale = self.config.landmarks.roi_scale
        faces = []
        for det in self.detect(rgb, both_ranges=True):
            lm, p = self._refine(rgb, roi_from_detection(det, scale))
            if p >= self.config.landmarks.min_presence:
                faces.append(self._face(lm, det.score, -1))
        faces.sort(key=lambda f: -f.size)
        return faces

    # -- video ----------------------------------------------------------------------------------

    def prepare(self) -> dict[str, list[int]]:
        """Build, before a live stream's first frame, what a first use would otherwise build in
        the middle of it; returns what was built, by model. The CPU analyser has nothing to build
        (GpuFaceAnalyser captures its CUDA graphs here)."""
        return {}

    def reset(self) -> None:
        """Forget all tracks (e.g. at a cut or a new stream), and any round left unfinished
        (`PendingTracks` abandoned after an error)."""
        self._tracks = []
        self._frames_seen = 0
        self._in_flight = False
        if self._hands is not None:
            self._hands.reset()

    def track(self, frame: Frame) -> list[Face]:
        """Faces of the next video frame, with stable track ids and smoothed landmarks."""
        return PendingTracks([(self, frame)]).finish()[0]

    def _follow_rois(self) -> list[Roi]:
        """Where each track's face should be in the next frame: from its last landmarks."""
        scale = self.config.landmarks.roi_scale
        return [roi_from_landmarks(tr.raw, scale) for tr in self._tracks]

    def _track_rest(self, frame: Frame, followed: list[tuple[np.ndarray, float]]) -> list[Face]:
        """`track` once the landmark model has followed the tracks (`followed`, in track order)."""
        rgb = frame.data
        cfg = self.config
        scale = cfg.landmarks.roi_scale
        t = frame.time if frame.time is not None else frame.index / 30.0
        # 1. Keep the tracks the landmark model still finds.
        kept: list[_Track] = []
        for tr, (lm, p) in zip(self._tracks, followed):
            if p >= cfg.landmarks.min_presence:
                tr.raw, tr.presence = lm, p
                kept.append(tr)
        # Two tracks that converged on one face: keep the older.
        deduped: list[_Track] = []
        for tr in sorted(kept, key=lambda x: x.track_id):
            box = landmark_box(tr.raw)
            if all(iou(box, landmark_box(o.raw)[None])[0] < _SAME_FACE_IOU for o in deduped):
                deduped.append(tr)
        self._tracks = deduped
        # 2. Detect on cadence, or whenever nothing is tracked, and start tracks for new faces.
        if (self._frames_seen % cfg.detector.detect_every == 0 or not self._tracks) and \
                len(self._tracks) < cfg.detector.max_faces:
            boxes = np.array([landmark_box(tr.raw) for tr in self._tracks]).reshape(-1, 4)
            # With nothing tracked, also try the other BlazeFace range: a user's clip may have faces
            # smaller (or larger) than the configured model is good at.
            for det in self.detect(rgb, both_ranges=not self._tracks):
                if len(self._tracks) >= cfg.detector.max_faces:
                    break
                if boxes.size and iou(det.box, boxes).max() >= _SAME_FACE_IOU:
                    continue
                lm, p = self._refine(rgb, roi_from_detection(det, scale))
                if p < cfg.landmarks.min_presence:
                    continue
                sm = cfg.smoothing
                smoother = OneEuroFilter(sm.min_cutoff, sm.beta, sm.d_cutoff) if sm.enabled else None
                self._tracks.append(_Track(self._next_id, lm, p, smoother, det.score))
                log.debug("frame %d: new face track %d", frame.index, self._next_id)
                self._next_id += 1
                boxes = np.vstack([boxes, landmark_box(lm)[None]])
        self._frames_seen += 1
        faces = []
        for tr in self._tracks:
            lm = tr.raw
            if tr.smoother is not None:
                size = float(np.ptp(lm[:, :2], axis=0).max())
                lm = tr.smoother(lm, t, size)
            faces.append(self._face(lm, tr.presence, tr.track_id))
        if self._hands is not None:
            # Hands are followed in every frame, faces or not, so that a hand is already known
            # when a face appears behind it; each face gets the hands that meet its box.
            hands = self._hands.track(rgb)
            for f in faces:
                f.extras["hands"] = hands_near(hands, f.box)
        return faces

    def close(self) -> None:
        if not self._owns_models:
            return
        for r in (self._short, self._full, self._mesh, self._hands):
            if r is not None:
                r.close()


def track_many(pairs: list[tuple[FaceAnalyser, Frame]]) -> list[list[Face]]:
    """`analyser.track(frame)` for each pair, with the landmark model run once for every track of
    every frame (`FaceMesh.start_frames`): one batch and one wait for many streams. The analysers
    must share their networks (`FaceAnalyser.tracker`); each keeps its own tracks. Detection, on
    its cadence, still runs per frame."""
    return PendingTracks(pairs).finish()


class PendingTracks:
    """`track_many` in two halves, so that a caller can launch other work (the previous round's
    swaps) while the landmark model runs: constructing it queues the landmark model for every
    track of every frame, `finish()` waits for the landmarks and does the rest of `track`.

    A tracker has at most one round in flight: its next round's regions of interest come from
    this round's landmarks. A round abandoned without `finish()` (after an error) leaves its
    trackers busy until their `reset()`.

    On the GPU, construct and finish a round on one CuPy stream, and make no other call of the
    same landmark model on another stream in between: the model's CUDA graph outputs are copied
    out in stream order, and detection (in `finish`) runs on the current stream."""

    def __init__(self, pairs: list[tuple[FaceAnalyser, Frame]]) -> None:
        self._pairs = pairs
        self._finished = not pairs
        if not pairs:
            return
        mesh = pairs[0][0]._mesh
        if any(a._mesh is not mesh for a, _f in pairs):
            raise ValueError("track_many needs trackers of one analyser (FaceAnalyser.tracker)")
        if len({id(a) for a, _f in pairs}) != len(pairs) or any(a._in_flight for a, _f in pairs):
            raise ValueError("a tracker can follow one frame at a time: finish its last round first")
        rois = [a._follow_rois() for a, _f in pairs]
        self._landmarks = mesh.start_frames([(f.data, r) for (_a, f), r in zip(pairs, rois)])
        # Only once the round is launched: a launch that fails leaves the trackers free.
        for a, _f in pairs:
            a._in_flight = True

    def finish(self) -> list[list[Face]]:
        """Each frame's faces, as `track` gives them."""
        if self._finished:
            if self._pairs:
                raise RuntimeError("PendingTracks.finish called twice")
            return []
        self._finished = True
        try:
            followed = self._landmarks.result()
        finally:
            for a, _f in self._pairs:
                a._in_flight = False
        return [a._track_rest(f, fol) for (a, f), fol in zip(self._pairs, followed)]
