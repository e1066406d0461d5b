"""Face analysis with a zoo detector (SCRFD, RetinaFace, YOLOface) at a cadence, with tracking.

The detector gives boxes, scores and the 5 alignment points directly. It runs every `detect_every`
frames; in between, each tracked face is carried forward at its last measured velocity (its box and
points moved by the displacement between its last two detections), and detections are matched to
tracks by box overlap so that track ids stay stable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engines.runner import Runner
from ..face.blazeface import iou
from ..types import Face, Frame
from .detect import decode_scrfd, decode_yoloface, prepare_detector_input

_MATCH_IOU = 0.3


@dataclass
class _Track:
    track_id: int
    box: np.ndarray
    kps: np.ndarray
    score: float
    velocity: np.ndarray
    """Pixels per frame, from the last two detections."""
    last_seen: int
    """Frame number of the last detection."""
    det_centre: np.ndarray
    """Box centre at the last detection (the box itself moves between detections)."""


class DetectorAnalyser:
    """Detects faces with a zoo detector runner and tracks them between detections."""

    def __init__(self, runner: Runner, family: str, size: int = 640, *, min_score: float = 0.5,
                 detect_every: int = 1, max_faces: int = 4) -> None:
        self.runner = runner
        self.family = family
        self.size = size
        self.min_score = min_score
        self.detect_every = detect_every
        self.max_faces = max_faces
        self.input_name = runner.inputs[0].name
        self._tracks: list[_Track] = []
        self._next_id = 0
        self._seen = 0

    def detect(self, rgb: np.ndarray) -> list[Face]:
        """Faces in one image, best score first."""
        tensor, scale = prepare_detector_input(rgb, self.size, self.family)
        outs = self.runner.infer({self.input_name: tensor})
        values = [outs[o.name] for o in self.runner.outputs]
        decode = decode_yoloface if self.family == "yoloface" else decode_scrfd
        boxes, scores, kps = decode(values, self.size, scale, self.min_score)
        return [Face(box=boxes[i].astype(np.float32), score=float(scores[i]),
                     kps=kps[i].astype(np.float32)) for i in range(min(len(scores), self.max_faces))]

    def analyse_image(self, rgb: np.ndarray) -> list[Face]:
        faces = self.detect(rgb)
        faces.sort(key=lambda f: -f.size)
        return faces

    def prepare(self) -> dict[str, list[int]]:
        """As `FaceAnalyser.prepare`: the detector's runner was activated (its model loaded or
        its engine built) before this analyser was made, so there is nothing left to build."""
        return {}

    def track(self, frame: Frame) -> list[Face]:
        n = self._seen
        self._seen += 1
        if n % self.detect_every == 0 or not self._tracks:
            self._update(self.detect(frame.data), n)
        else:
            for tr in self._tracks:
                tr.box = tr.box + np.tile(tr.velocity, 2)
                tr.kps = tr.kps + tr.velocity
        return [Face(box=t.box.copy(), score=t.score, kps=t.kps.copy(), track_id=t.track_id)
                for t in self._tracks]

    def _update(self, faces: list[Face], n: int) -> None:
        kept: list[_Track] = []
        free = list(self._tracks)
        for f in faces:
            best = None
            if free:
                overlaps = iou(f.box, np.stack([t.box for t in free]))
                j = int(np.argmax(overlaps))
                if overlaps[j] >= _MATCH_IOU:
                    best = free.pop(j)
            c = np.array([(f.box[0] + f.box[2]) / 2, (f.box[1] + f.box[3]) / 2], np.float32)
            if best is None:
                kept.append(_Track(self._next_id, f.box, f.kps, f.score, np.zeros(2, np.float32), n, c))
                self._next_id += 1
            else:
                best.velocity = (c - best.det_centre) / max(n - best.last_seen, 1)
                best.box, best.kps, best.score, best.last_seen, best.det_centre = f.box, f.kps, f.score, n, c
                kept.append(best)
        self._tracks = kept

    def close(self) -> None:
        self.runner.deactivate()
