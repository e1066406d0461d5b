"""The built-in `mesh` swapper: the source face's texture mapped triangle by triangle onto the target.

Per target face: rasterise the target's Face Mesh triangles into a map of source coordinates, sample the
source texture through it, match its colours to the target's skin in L*a*b*, build a feathered mask
from the face outline (minus the inner mouth and, optionally, the eyes), and alpha-blend the result
into the frame. Every array step is an op in `swapstream.kernels`, so the same code runs on NumPy
here and on the GPU kernels later.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..config import MeshConfig
from ..errors import NoFaceError
from ..kernels._xp import get_xp
from ..kernels.mesh import rasterize_mesh
from ..kernels.meshswap import STATS_LEN, color_stats, mesh_mask, transfer_blend
from ..kernels.warp import remap_bilinear
from ..types import Face
from ..face.topology import Topology, closed_mesh_points, closed_mesh_triangles, load_topology

# Keep-out regions are grown about their centroid so that the kept target mouth/eyes include the
# lip and lid edges: a seam exactly on the edge shows more than one just outside it.
_MOUTH_GROW = 1.15
_EYE_GROW = 1.35


class Workspace:
    """Scratch buffers reused from face to face and frame to frame, grown only when a face is larger."""

    def __init__(self, xp: ModuleType = np) -> None:
        self.xp = xp
        """Array module the buffers live in: NumPy, or CuPy for the GPU path."""
        self._bufs: dict[str, Any] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A view of the named buffer with exactly `shape`; contents are undefined."""
        buf = self._bufs.get(name)
        n = int(np.prod(shape))
        if buf is None or buf.size < n or buf.dtype != np.dtype(dtype):
            buf = self.xp.empty(max(n, int(n * 1.25)), dtype=dtype)
            self._bufs[name] = buf
        return buf[:n].reshape(shape)

    def upload(self, name: str, host: np.ndarray) -> Any:
        """`host` in the workspace's memory. On the GPU the copy goes through a reused pinned buffer
        and runs asynchronously on the current stream: a pageable copy would block the host until
        every kernel queued before it had finished."""
        if self.xp is np:
            return host
        import cupy
        import cupyx

        n = host.size
        pinned = self._bufs.get(name + ".pinned")
        if pinned is None or pinned.size < n or pinned.dtype != host.dtype:
            pinned = cupyx.empty_pinned(max(n, int(n * 1.25)), dtype=host.dtype)
            self._bufs[name + ".pinned"] = pinned
        done = self._bufs.get(name + ".event")
        if done is not None:
            done.synchronize()  # the previous copy out of this pinned buffer has finished
        staged = pinned[:n].reshape(host.shape)
        staged[...] = host
        dev = self.get(name, host.shape, host.dtype)
        stream = cupy.cuda.get_current_stream()
        dev.set(staged, stream=stream)
        event = cupy.cuda.Event()
        event.record(stream)
        self._bufs[name + ".event"] = event
        return dev


@dataclass
class SwapRegion:
    """Where one face was pasted: frame origin and the mask that was used, for tests and debugging."""

    origin: tuple[int, int]
    mask: np.ndarray


def _grow(poly: np.ndarray, factor: float) -> np.ndarray:
    c = poly.mean(axis=0)
    return ((poly - c) * factor + c).astype(np.float32)


class MeshSwapper:
    """Swaps a source face into target faces. Call `set_source` once, then `swap` per frame."""

    def __init__(self, config: MeshConfig, topology: Topology | None = None) -> None:
        self.config = config
        self.topo = topology or load_topology()
        self._tris = closed_mesh_triangles(self.topo)
        self._src_img: np.ndarray | None = None
        self._src_pts: np.ndarray | None = None
        # Per array module (NumPy, CuPy): device copies of the source and topology, and scratch
        # buffers. Frames on the GPU are swapped there; the source is uploaded once.
        self._dev: dict[str, dict[str, Any]] = {}

    def set_source(self, image: np.ndarray, face: Face) -> None:
        """Use `face` in `image` (HxWx3 uint8 RGB) as the identity to paste."""
        if face.landmarks is None:
            raise NoFaceError("the source face has no dense landmarks; the mesh swapper needs them")
        self._src_img = np.ascontiguousarray(image)
        self._src_pts = closed_mesh_points(face.landmarks[:, :2], self.topo)
        self._dev = {}

    def _on(self, xp: ModuleType) -> dict[str, Any]:
        """The source, triangles and workspace in `xp`'s memory, made on first use."""
        d = self._dev.get(xp.__name__)
        if d is None:
            d = {"img": xp.asarray(self._src_img), "pts": xp.asarray(self._src_pts),
                 "tris": xp.asarray(self._tris), "ws": Workspace(xp)}
            self._dev[xp.__name__] = d
        return d

    def region(self, face: Face, frame_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
        """(x0, y0, w, h) of the frame area one face can touch, clipped to the frame."""
        assert face.landmarks is not None
        xy = face.landmarks[:, :2]
        lo = np.floor(xy.min(axis=0)).astype(int) - 2
        hi = np.ceil(xy.max(axis=0)).astype(int) + 3
        H, W = frame_shape[:2]
        x0, y0 = max(int(lo[0]), 0), max(int(lo[1]), 0)
        x1, y1 = min(int(hi[0]), W), min(int(hi[1]), H)
        return x0, y0, max(x1 - x0, 0), max(y1 - y0, 0)

    def swap(self, frame: Any, faces: list[Face]) -> list[SwapRegion]:
        """Swap every face in `frame` (HxWx3 uint8 RGB, NumPy or CuPy, modified in place).

        Returns what was touched. Landmarks stay on the host; a CuPy frame is swapped on the GPU.
        """
        if self._src_img is None or self._src_pts is None:
            raise RuntimeError("MeshSwapper.swap called before set_source")
        done = []
        for face in faces:
            if face.landmarks is None:
                continue
            r = self._swap_one(frame, face)
            if r is not None:
                done.append(r)
        return done

    def _swap_one(self, frame: Any, face: Face) -> SwapRegion | None:
        assert self._src_img is not None and self._src_pts is not None and face.landmarks is not None
        cfg = self.config
        xp = get_xp(frame)
        dev = self._on(xp)
        ws = dev["ws"]
        x0, y0, w, h = self.region(face, frame.shape)
        if w < 4 or h < 4:
            return None
        dst_host = closed_mesh_points(face.landmarks[:, :2], self.topo)
        keep_polys = []
        if cfg.keep_mouth:
            keep_polys.append(_grow(dst_host[self.topo.lips_inner], _MOUTH_GROW))
        if cfg.keep_eyes:
            keep_polys.append(_grow(dst_host[self.topo.image_left_eye], _EYE_GROW))
            keep_polys.append(_grow(dst_host[self.topo.image_right_eye], _EYE_GROW))
        # Everything per face that comes from the host goes up in one array (one copy on the GPU).
        n_pts, n_oval = dst_host.shape[0], self.topo.face_oval.size
        packed = ws.upload("packed", np.concatenate([dst_host, dst_host[self.topo.face_oval]]
                                                   + keep_polys).astype(np.float32))
        dst = packed[:n_pts]
        outline = packed[n_pts:n_pts + n_oval]
        keep = packed[n_pts + n_oval:]
        origin = (x0, y0)

        # Geometry: source coordinates for every covered pixel, then the source texture through them.
        src_map = rasterize_mesh(dst, dev["pts"], dev["tris"], origin, ws.get("map", (h, w, 2)))
        warped = remap_bilinear(dev["img"], src_map, ws.get("warped", (h, w, 3)))

        # Mask: face outline where the mesh covers, feathered inward, minus the keep-out regions.
        sigma = max(cfg.feather * float(max(w, h)) / 2.5, 0.5)
        mask = mesh_mask(outline, keep, tuple(len(p) for p in keep_polys), src_map, origin, sigma,
                         max(sigma * 0.5, 0.5), ws.get("mask", (h, w)))

        # Colour: move the source skin's statistics onto the target's inside the mask, and blend.
        space = cfg.color_match if cfg.color_strength > 0 else "none"
        stats = None
        if space != "none":
            stats = color_stats(warped, frame, mask, origin, space,
                                ws.get("stats", (STATS_LEN,), np.float64))
        transfer_blend(frame, warped, mask, stats, origin, space, cfg.color_strength)
        return SwapRegion(origin, mask)


def source_face(faces: list[Face], what: str) -> Face:
    """The face to take the identity from: the largest one, or a NoFaceError naming the input."""
    if not faces:
        raise NoFaceError(f"no face found in source image '{what}'. Use a clear, frontal photo in "
                          f"which the face fills at least a fifth of the picture.")
    return max(faces, key=lambda f: f.size)
