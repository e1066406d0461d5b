"""The built-in `mesh` swapper: the source face's texture mapped triangle by triangle onto the target.

Per target face: rasterise the target's Face Mesh triangles into a map of source coordinates, sample the
source texture through it, match its colours to the target's skin in L*a*b*, build a feathered mask
from the face outline (minus the inner mouth and, optionally, the eyes), and alpha-blend the result
into the frame. Every array step is an op in `swapstream.kernels`: CuPy frames run the CUDA kernels,
NumPy frames the OpenCV product path (`kernels.meshswap_cpu`), and `reference=True` the NumPy
references that both are tested against.

Source validity: a source landmark outside the source image (a photo cut at the forehead, chin or one
cheek) has no texture. A triangle that needs one samples its mirror image on the other side of the
face instead (the Face Mesh is left/right symmetric, `face.topology.load_mirror`), and when that one
is cut off too the triangle is not drawn: the mask excludes it and the target stays there. Nothing is
ever sampled outside the source image.

Colour statistics are smoothed per track (an exponential moving average), so that the transfer does
not flicker from frame to frame on a still head.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..config import MeshConfig
from ..errors import NoFaceError
from ..kernels._xp import get_xp
from ..kernels.mesh import facing_winding, rasterize_mesh, rasterize_mesh_fast
from ..kernels.meshswap import STATS_LEN, color_stats, mesh_mask, smooth_stats, transfer_blend
from ..kernels.meshswap_cpu import color_stats_fast, mesh_mask_fast, remap_fast, transfer_blend_fast
from ..kernels.warp import remap_bilinear
from ..types import Face
from .occlusion import OcclusionMasker
from ..face.topology import (HOLE_RINGS, Topology, closed_mesh_mirror, closed_mesh_points,
                             closed_mesh_triangles, load_topology)

# Keep-out regions are grown about their centroid so that the kept target mouth/eyes include the
# lip and lid edges: a seam exactly on the edge shows more than one just outside it.
_MOUTH_GROW = 1.15
_EYE_GROW = 1.35
# A source vertex counts as inside the image when it is at least this far inside the outermost pixel
# centres, so that a bilinear sample near it never needs a pixel beyond the edge.
_SOURCE_MARGIN = 1.0
# Weight of the newest frame in the per-track colour statistics: a time constant of about 4 frames,
# quick enough to follow a light change, slow enough to settle landmark jitter.
COLOR_EMA = 0.25
# A track's colour state is forgotten after this many frames without it.
_TRACK_TTL = 30


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

    def __init__(self, config: MeshConfig, topology: Topology | None = None, *,
                 reference: bool = False, occlusion: OcclusionMasker | None = None) -> None:
        self.config = config
        self.occlusion = occlusion
        """Occlusion hook (issue 20): per-track mask of what is in front of the face, or None."""
        self.topo = topology or load_topology()
        self.reference = reference
        """NumPy frames run the NumPy reference ops instead of the OpenCV product path (tests)."""
        self._all_tris = closed_mesh_triangles(self.topo)
        self._mirror = closed_mesh_mirror(self.topo)
        self._src_img: np.ndarray | None = None
        self._src_pts: np.ndarray | None = None
        # The triangles drawn for this source and the source vertices each one samples (its own, or
        # its mirror image's when its own fall outside the source image).
        self._tris = self._all_tris
        self._src_tris = self._all_tris
        # Per array module (NumPy, CuPy): device copies of the source, and scratch buffers. Frames on
        # the GPU are swapped there; the source is uploaded once.
        self._dev: dict[str, dict[str, Any]] = {}
        # Per (array module, track id): smoothed colour statistics and the frame they were last used.
        self._color: dict[tuple[str, int], tuple[Any, int]] = {}
        self._frame_no = 0

    def set_source(self, image: np.ndarray, face: Face) -> None:
        """Use `face` in `image` (HxWx3 uint8 RGB) as the identity to paste."""
        if face.landmarks is None:
            raise NoFaceError("the source face has no dense landmarks; the mesh swapper needs them")
        self._src_img = np.ascontiguousarray(image)
        self._src_pts = closed_mesh_points(face.landmarks[:, :2], self.topo)
        self._tris, self._src_tris = source_triangles(self._src_pts, image.shape[:2],
                                                      self._all_tris, self._mirror)
        self._dev = {}
        self._color = {}

    def _on(self, xp: ModuleType) -> dict[str, Any]:
        """The source and workspace in `xp`'s memory, made on first use."""
        d = self._dev.get(xp.__name__)
        if d is None:
            d = {"img": xp.asarray(self._src_img), "pts": xp.asarray(self._src_pts),
                 "ws": Workspace(xp)}
            if xp is np and not self.reference:
                # cv2.remap samples float32 images without converting them on every call.
                d["img_f32"] = self._src_img.astype(np.float32)
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

    def swap(self, frame: Any, faces: list[Face]) -> int:
        """Swap every face in `frame` in place; returns the number swapped (`FaceSwapper`)."""
        return len(self.swap_regions(frame, faces))

    def swap_regions(self, frame: Any, faces: list[Face]) -> list[SwapRegion]:
        """Swap every face in `frame` (HxWx3 uint8 RGB, NumPy or CuPy, modified in place).

        Returns what was touched, with the masks used (for tests and the quality tools). Landmarks
        stay on the host; a CuPy frame is swapped on the GPU.
        """
        if self._src_img is None or self._src_pts is None:
            raise RuntimeError("MeshSwapper.swap called before set_source")
        self._frame_no += 1
        done = []
        for face in faces:
            if face.landmarks is None:
                continue
            r = self._swap_one(frame, face)
            if r is not None:
                done.append(r)
        stale = [k for k, (_, seen) in self._color.items() if self._frame_no - seen > _TRACK_TTL]
        for k in stale:
            del self._color[k]
        return done

    def _depth_order(self, face: Face) -> np.ndarray:
        """Indices of the drawn triangles from far to near (the rasteriser lets the highest index win
        where folds of a turned head overlap, so the nearest surface is shown)."""
        lm = face.landmarks
        assert lm is not None
        if lm.shape[1] < 3:
            return np.arange(len(self._tris))
        z = np.concatenate([lm[:, 2], [lm[getattr(self.topo, r), 2].mean() for r in HOLE_RINGS]])
        # Face Mesh depth grows away from the camera: the largest mean depth comes first.
        return np.argsort(-z[self._tris].mean(axis=1), kind="stable")

    def _smoothed(self, xp: ModuleType, face: Face, stats: Any) -> Any:
        """`stats` smoothed over the frames of the face's track (untracked faces: as they are)."""
        if face.track_id < 0:
            return stats
        key = (xp.__name__, face.track_id)
        state = self._color.get(key, (None, 0))[0]
        if state is None:
            state = xp.zeros(STATS_LEN, dtype=xp.float64)
        smooth_stats(stats, state, COLOR_EMA)
        self._color[key] = (state, self._frame_no)
        return state

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
        order = self._depth_order(face)
        tris = ws.upload("tris", np.ascontiguousarray(self._tris[order]))
        src_tris = ws.upload("src_tris", np.ascontiguousarray(self._src_tris[order]))
        origin = (x0, y0)
        fast = xp is np and not self.reference

        # Geometry: source coordinates for every covered pixel, then the source texture through them.
        raster = rasterize_mesh_fast if fast else rasterize_mesh
        # The closed mesh is wound consistently, so the target's majority winding faces the camera;
        # the source's own winding would wrongly cull triangles that fold in the source photo.
        src_map = raster(dst, dev["pts"], tris, origin, ws.get("map", (h, w, 2)), src_tris=src_tris,
                         front=facing_winding(dst_host, self._tris))
        if fast:
            warped = remap_fast(dev["img_f32"], src_map, ws.get("warped", (h, w, 3)))
        else:
            warped = remap_bilinear(dev["img"], src_map, ws.get("warped", (h, w, 3)))

        # Mask: face outline where the mesh covers, feathered inward, minus the keep-out regions.
        sigma = max(cfg.feather * float(max(w, h)) / 2.5, 0.5)
        mask = (mesh_mask_fast if fast else mesh_mask)(
            outline, keep, tuple(len(p) for p in keep_polys), src_map, origin, sigma,
            max(sigma * 0.5, 0.5), ws.get("mask", (h, w)))
        # Occlusion hook (issue 20): the target stays where something is in front of the face.
        if self.occlusion is not None:
            mask *= self.occlusion.visible(frame, face, (x0, y0, w, h))

        # Colour: move the source skin's statistics onto the target's inside the mask, and blend.
        space = cfg.color_match if cfg.color_strength > 0 else "none"
        stats = None
        out_stats = ws.get("stats", (STATS_LEN,), np.float64)
        if fast:
            labs: dict[str, np.ndarray] = {}
            if space != "none":
                stats = self._smoothed(xp, face, color_stats_fast(warped, frame, mask, origin, space,
                                                                  out_stats, labs))
            transfer_blend_fast(frame, warped, mask, stats, origin, space, cfg.color_strength, labs)
        else:
            if space != "none":
                stats = self._smoothed(xp, face, color_stats(warped, frame, mask, origin, space,
                                                             out_stats))
            transfer_blend(frame, warped, mask, stats, origin, space, cfg.color_strength)
        return SwapRegion(origin, mask)


def source_triangles(src_pts: np.ndarray, image_hw: tuple[int, int], tris: np.ndarray,
                     mirror: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(triangles to draw, source vertices each one samples) for a source face whose landmarks
    `src_pts` ((N, 2), closed mesh) lie in an image of `image_hw`.

    A triangle whose three source vertices are inside the image samples itself; otherwise, when its
    mirror image's three are, it samples that one (a triangle of the image is inside the image: the
    image is convex); otherwise it is left out."""
    h, w = image_hw
    m = _SOURCE_MARGIN
    ok = ((src_pts[:, 0] >= m) & (src_pts[:, 0] <= w - 1 - m)
          & (src_pts[:, 1] >= m) & (src_pts[:, 1] <= h - 1 - m))
    own = ok[tris].all(axis=1)
    mirrored = mirror[tris]
    other = ok[mirrored].all(axis=1) & ~own
    keep = own | other
    src_tris = np.where(other[:, None], mirrored, tris)
    return (np.ascontiguousarray(tris[keep], dtype=np.int32),
            np.ascontiguousarray(src_tris[keep], dtype=np.int32))


def source_face(faces: list[Face], what: str) -> Face:
    """The face to take the identity from: the largest one, or a NoFaceError naming the input."""
    if not faces:
        raise NoFaceError(f"no face found in source image '{what}'. Use a clear, frontal photo in "
                          f"which the face fills at least a fifth of the picture.")
    return max(faces, key=lambda f: f.size)
