"""Swap backends: the swappers as the runtime sees them, one set per device, shared by its streams.

A backend turns a source image into an identity (once per stream and source face) and swaps a batch
of frames' faces, each frame with its own stream's identity, in one call. `MeshBackend` wraps the
built-in mesh swapper (its "batch" is a loop: the mesh kernels work face by face); `NeuralBackend`
wraps the zoo swapper of `neural/factory.py`, whose model runs the faces of several streams as one
batch. ("Engine" is kept for `swapstream.engines` and the TensorRT engines it builds.)

Backends are built and called only in their device's worker thread (see `manager.DeviceSlot`): the
models and their CUDA graphs are not thread-safe, and one thread per GPU is what orders the work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import cv2
import numpy as np

from ..config import Config
from ..types import Face

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SwapItem:
    """One frame's faces to swap, in place, with its stream's identity. Compared by identity: the
    generated `==` would compare the frames, and a NumPy array has no single truth value."""

    frame: Any
    """HxWx3 uint8 RGB, modified in place."""
    faces: list[Face]
    identity: Any
    """What the backend's `identity` returned for this stream's source face."""
    scale: float = 1.0
    """Below 1: swap at this fraction of the resolution (the controller's `low_res` step, host
    frames only: streams on a GPU do not have that step)."""
    region: bool = True
    """False: skip the region parser for these faces (the controller's `region_off` step)."""
    enhance: bool = True
    """False: skip the face enhancer for these faces (the controller's `enhancer_off` step)."""
    stream_id: str = ""
    """Its stream: the device thread's time is split between streams by their faces
    (`DeviceSlot.stream_shares`), which the worker's load report turns into a cost per swapper."""
    started: float = 0.0
    """time.monotonic() when its batch started (set by the device thread)."""
    ended: float = 0.0
    """time.monotonic() when its batch ended."""
    share: float = 0.0
    """Its part of its batch's time, by faces: what it cost the device (the batch's time is what it
    waited)."""


class SwapFailed(Exception):
    """The batch this frame was in failed: the frame goes on as it came (unswapped), and the stream
    carries on. The message is the backend's error."""


class SwapBackend(Protocol):
    """What the runtime needs from a swapper (mesh, neural, or a test's instrumented backend)."""

    name: str
    max_batch: int
    """Most faces one `swap` call should get (the batcher's batch size)."""

    def identity(self, image: np.ndarray) -> Any:
        """The identity of the largest face of an RGB image; NoFaceError names the image otherwise."""
        ...

    def swap(self, items: list[SwapItem]) -> list[int]:
        """Swap each item's faces in place; returns the faces swapped per item."""
        ...

    def close(self) -> None: ...


BackendFactory = Callable[[str, Config, str], SwapBackend]
"""Builds the backend for swapper `name` with the runtime's config on a device ("cpu", "cuda:0")."""


def _scale_face(face: Face, x0: int, y0: int, fx: float, fy: float) -> Face:
    off = np.array([x0, y0], np.float32)
    f = np.array([fx, fy], np.float32)
    lm = None
    if face.landmarks is not None:
        lm = face.landmarks.copy()
        lm[:, :2] = (lm[:, :2] - off) * f
        lm[:, 2] *= fx  # depth is in pixels too
    box = ((face.box.reshape(2, 2) - off) * f).reshape(4)
    return replace(face, box=box.astype(np.float32), kps=((face.kps - off) * f).astype(np.float32),
                   landmarks=lm)


def swap_scaled(frame: np.ndarray, faces: list[Face], scale: float,
                swap: Callable[[np.ndarray, list[Face]], int]) -> int:
    """Swap `faces` at `scale` of the resolution: the region around them is shrunk, swapped, and only
    the change is scaled back up and added, so pixels the swap does not touch keep full resolution.
    Host frames only (the GPU path swaps at full resolution)."""
    H, W = frame.shape[:2]
    boxes = np.array([f.box if f.landmarks is None else
                      np.r_[f.landmarks[:, :2].min(0), f.landmarks[:, :2].max(0)] for f in faces])
    lo, hi = boxes[:, :2].min(0), boxes[:, 2:].max(0)
    pad = 0.2 * (hi - lo)  # the mask's feather and the neural paste-back box reach past the mesh
    x0, y0 = (max(int(v), 0) for v in np.floor(lo - pad))
    x1, y1 = int(min(np.ceil(hi[0] + pad[0]), W)), int(min(np.ceil(hi[1] + pad[1]), H))
    w, h = x1 - x0, y1 - y0
    if w < 8 or h < 8:
        return 0
    sw, sh = max(8, round(w * scale)), max(8, round(h * scale))
    crop = frame[y0:y1, x0:x1]
    small = cv2.resize(crop, (sw, sh), interpolation=cv2.INTER_AREA)
    before = small.copy()
    n = swap(small, [_scale_face(f, x0, y0, sw / w, sh / h) for f in faces])
    delta = cv2.resize(small.astype(np.int16) - before, (w, h), interpolation=cv2.INTER_LINEAR)
    crop[...] = np.clip(crop.astype(np.int16) + delta, 0, 255).astype(np.uint8)
    return n


def source_analyser(config: Config, device: str) -> Any:
    """The analyser of uploaded source images: LiteRT on the CPU; on a GPU the same networks through
    PyTorch (so a GPU machine needs no LiteRT), uncompiled, since a source face is analysed once per
    upload and compiling would only add seconds."""
    if device.startswith("cuda"):
        from ..gpu.analyser import GpuFaceAnalyser

        cfg = config.model_copy(deep=True)
        cfg.landmarks.compile = False
        analyser = GpuFaceAnalyser(cfg)
        # Its CUDA graphs now, while no stream runs: captured at a stream's first source face, a
        # capture met the other threads' GPU work and failed (cudaErrorStreamCaptureInvalidated).
        analyser.prepare()
        return analyser
    from ..face.analyser import FaceAnalyser

    return FaceAnalyser(config)


class MeshBackend:
    """The built-in mesh swapper for many streams: one `MeshSwapper` (source texture, scratch
    buffers) per identity, one face analyser for the source images."""

    name = "mesh"

    def __init__(self, config: Config, device: str = "cpu") -> None:
        self.config = config
        self.max_batch = config.neural.max_batch
        self._analyser = source_analyser(config, device)

    def identity(self, image: np.ndarray) -> Any:
        from ..swap.mesh import MeshSwapper, source_face
        from ..swap.occlusion import occlusion_masker

        topo = self._analyser.topology
        swapper = MeshSwapper(self.config.mesh, topo, occlusion=occlusion_masker(self.config.mask, topo))
        swapper.set_source(image, source_face(self._analyser.analyse_image(image), "uploaded source"))
        return swapper

    def swap(self, items: list[SwapItem]) -> list[int]:
        out = []
        for it in items:
            def one(frame: Any, faces: list[Face], s: Any = it.identity) -> int:
                return s.swap(frame, faces)

            if it.scale < 1.0 and isinstance(it.frame, np.ndarray):
                out.append(swap_scaled(it.frame, it.faces, it.scale, one))
            else:
                out.append(one(it.frame, it.faces))
        return out

    def close(self) -> None:
        self._analyser.close()


class NeuralBackend:
    """A zoo swapper (inswapper, hyperswap, simswap...) for many streams: the faces of every item go
    into `swap_many` together, each with its own stream's source vector."""

    def __init__(self, name: str, config: Config, device: str = "cpu") -> None:
        from ..neural.factory import NeuralStages

        cfg = config.model_copy(deep=True)
        cfg.swapper = name
        self.name = name
        # The runtime's streams are tracked by the built-in analyser (runtime.stream), whatever
        # neural.detector says: their faces carry the mesh an `area` mask reads.
        self._stages = NeuralStages(cfg, builtin_tracking=True)
        self.swapper = self._stages.swapper
        self.max_batch = self.swapper.max_batch
        self._analyser = self._stages.analyser or source_analyser(cfg, device)
        if device.startswith("cuda"):
            self._warm_batches()

    def _warm_batches(self) -> None:
        """Run the swap model at every batch size before any stream does: each size's CUDA graph is
        captured on its first call, and a capture while other threads work on the GPU fails (and
        stalls the device thread for seconds even when it does not)."""
        import cupy

        from ..demo import astronaut
        from ..swap.mesh import source_face

        image = astronaut()
        face = source_face(self._analyser.analyse_image(image), "built-in warm-up portrait")
        self.swapper.warm_up(cupy.asarray(image), face, self.swapper.identity(image, face), self.max_batch)
        cupy.cuda.get_current_stream().synchronize()

    def identity(self, image: np.ndarray) -> Any:
        from ..swap.mesh import source_face

        face = source_face(self._analyser.analyse_image(image), "uploaded source")
        return self.swapper.identity(image, face)

    def swap(self, items: list[SwapItem]) -> list[int]:
        full = [it for it in items if it.scale >= 1.0 or not isinstance(it.frame, np.ndarray)]
        # Streams stepped down to `region_off` or `enhancer_off` batch apart from the others: the
        # parser and the enhancer run (or not) per model call.
        groups: dict[tuple[bool, bool], list[SwapItem]] = {}
        for it in full:
            groups.setdefault(self._stack_key(it), []).append(it)
        for key, group in groups.items():
            pairs = [(it.frame, f) for it in group for f in it.faces]
            sources = [it.identity for it in group for _ in it.faces]
            if pairs:
                self._set_stack(key)
                self.swapper.swap_many(pairs, sources)
        at_full = {id(it) for it in full}
        out = []
        for it in items:
            if id(it) in at_full:
                out.append(len(it.faces))
            else:
                self._set_stack(self._stack_key(it))
                out.append(swap_scaled(it.frame, it.faces, it.scale, lambda fr, fc, s=it.identity:
                                       self.swapper.swap_many([(fr, f) for f in fc], [s] * len(fc))))
        self._set_stack((True, True))
        return out

    def _stack_key(self, it: SwapItem) -> tuple[bool, bool]:
        # Only flags that change something split a batch.
        return (it.region or self.swapper.masker is None, it.enhance or self.swapper.enhancer is None)

    def _set_stack(self, key: tuple[bool, bool]) -> None:
        region, enhance = key
        if self.swapper.masker is not None:
            self.swapper.masker.use_region = region
        if self.swapper.enhancer is not None:
            self.swapper.enhancer.enabled = enhance

    def close(self) -> None:
        self._analyser.close()
        self._stages.close()


def default_backend_factory(name: str, config: Config, device: str) -> SwapBackend:
    """`mesh` or a zoo swapper. On a CUDA device the backend is built inside that device's context
    (the caller's worker thread has made it current)."""
    t0 = time.perf_counter()
    backend: SwapBackend = (MeshBackend(config, device) if name == "mesh"
                            else NeuralBackend(name, config, device))
    log.info("swap backend %s ready on %s in %.1f s", name, device, time.perf_counter() - t0)
    return backend
