"""Neural swappers (the FaceFusion zoo): alignment, embedding, batched inference and paste-back.

The per-pixel work runs through `swapstream.kernels` ops (`crop_batch` for the fused crop and
normalisation, `paste_back` for the fused inverse warp, box mask and blend), so it stays on the GPU
when frames are CuPy arrays and runs the NumPy references otherwise. The model runs through any
`Runner` (ONNX Runtime, PyTorch, TensorRT).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from ..engines.runner import Runner
from ..errors import NoFaceError
from ..kernels._xp import get_xp
from ..kernels.crop import crop_batch
from ..kernels.paste import paste_back
from ..kernels.warp import invert_affine
from ..types import Face
from ..kernels.paste import box_mask
from .face_stack import FaceEnhancer, FaceMasker, compose, crop_points68, per_channel

log = logging.getLogger(__name__)

EmbeddingKind = Literal["emap", "normalized", "raw"]
OutputRange = Literal["0_1_clip", "std_mean"]


@dataclass(frozen=True)
class SwapContract:
    """What a swapper model expects and returns (docs/neural.md, "Swappers")."""

    size: int
    """Square input and output size in pixels."""
    template: np.ndarray
    """(5, 2) warp template, normalised to the crop size."""
    mean: tuple[float, float, float]
    """Per-channel mean of the (x/255 - mean)/std input normalisation, RGB."""
    std: tuple[float, float, float]
    """Per-channel std of that normalisation."""
    embedding: EmbeddingKind
    """How the source embedding becomes the model's source input."""
    output_range: OutputRange
    """`0_1_clip`: output is RGB in [0, 1]; `std_mean`: output * std + mean gives [0, 1]."""
    target_name: str = "target"
    source_name: str = "source"


def align_matrix(kps: np.ndarray, template: np.ndarray, size: int) -> np.ndarray:
    """2x3 similarity transform from frame pixels to crop pixels that puts the 5 points on the
    template, fitted as FaceFusion does (`estimateAffinePartial2D`, RANSAC with a threshold so wide
    that all five points count, i.e. a least-squares fit)."""
    src = np.asarray(kps, dtype=np.float32).reshape(5, 2)
    dst = (np.asarray(template, dtype=np.float32) * size).reshape(5, 2)
    m, _ = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=100)
    if m is None:
        raise NoFaceError("the face's 5 key points are degenerate (all on a line); cannot align it")
    return m.astype(np.float64)


def source_vector(embedding: np.ndarray, kind: EmbeddingKind, emap: np.ndarray | None) -> np.ndarray:
    """The model's source input from a raw ArcFace embedding (1, 512) float32."""
    e = np.asarray(embedding, dtype=np.float64).reshape(1, -1)
    if kind == "raw":
        return e.astype(np.float32)
    e = e / np.linalg.norm(e)
    if kind == "normalized":
        return e.astype(np.float32)
    if emap is None:
        raise ValueError("an 'emap' swapper needs the model's emap matrix")
    latent = e @ emap.astype(np.float64)
    return (latent / np.linalg.norm(latent)).astype(np.float32)


class Embedder:
    """ArcFace: a face aligned to arcface_112_v2 at 112x112, RGB, x/127.5 - 1 -> (1, 512)."""

    def __init__(self, runner: Runner, template: np.ndarray, size: int = 112) -> None:
        self.runner = runner
        self.template = template
        self.size = size
        self.input_name = runner.inputs[0].name

    def embed(self, image: Any, face: Face) -> np.ndarray:
        """Raw embedding (1, 512) float32 of `face` in `image` (HxWx3 uint8 RGB, host or GPU)."""
        xp = get_xp(image)
        m = align_matrix(face.kps, self.template, self.size)
        mats = xp.asarray(invert_affine(m)[None].astype(np.float32))
        batch = xp.empty((1, 3, self.size, self.size), xp.float32)
        crop_batch(image, mats, batch, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
        out = self.runner.infer({self.input_name: batch})
        e = next(iter(out.values()))
        e = e.get() if hasattr(e, "get") else np.asarray(e)
        return np.asarray(e, dtype=np.float32).reshape(1, -1)


class NeuralSwapper:
    """Swaps a source identity into faces with a zoo swapper model, up to `max_batch` faces a call."""

    def __init__(self, contract: SwapContract, runner: Runner, embedder: Embedder, *,
                 emap: np.ndarray | None = None, converter: Runner | None = None,
                 max_batch: int = 4, blur: float = 0.3,
                 padding: tuple[float, float, float, float] = (0, 0, 0, 0),
                 masker: FaceMasker | None = None, enhancer: FaceEnhancer | None = None) -> None:
        self.contract = contract
        self.runner = runner
        self.embedder = embedder
        self.emap = emap
        self.converter = converter
        """Maps the ArcFace embedding into the swapper's own space (crossface_* for simswap, ghost)."""
        self.max_batch = max_batch
        self.blur = blur
        self.padding = padding
        self.masker = masker
        """Occlusion and region masks on the aligned target crop (`mask.types`); None: box only."""
        self.enhancer = enhancer
        """Face enhancer after the swap, sharing its paste-back (`enhancer`); None: no enhancer."""
        self._source: np.ndarray | None = None
        self.batches_run = 0
        """Model calls made, for statistics."""

    def set_source(self, image: Any, face: Face) -> None:
        """Compute the source identity once, from `face` in `image`."""
        self._source = self.identity(image, face)

    def identity(self, image: Any, face: Face) -> np.ndarray:
        """The model's (1, D) source input for `face` in `image`, without making it the current one
        (the multi-stream runtime keeps one per stream and passes them to `swap_many`)."""
        e = self.embedder.embed(image, face)
        if self.converter is not None:
            out = self.converter.infer({self.converter.inputs[0].name: e})
            c = next(iter(out.values()))
            e = np.asarray(c.get() if hasattr(c, "get") else c, dtype=np.float32).reshape(1, -1)
        return source_vector(e, self.contract.embedding, self.emap)

    def warm_up(self, frame: Any, face: Face, ident: np.ndarray, batches: int) -> None:
        """Swap `face` in `frame` at every batch size from 1 to `batches`, twice each, on the current
        stream: each size's CUDA graph is captured by its first call (and per stream), replayed by the
        second, so that no capture falls in a stream's or a loop's time."""
        for n in range(1, max(1, batches) + 1):
            for _ in range(2):
                self.swap_many([(frame, face)] * n, [ident] * n)

    def swap(self, frame: Any, faces: list[Face]) -> int:
        """Swap every face of one frame in place; returns the number swapped."""
        return self.swap_many([(frame, f) for f in faces])

    def swap_many(self, items: list[tuple[Any, Face]], sources: list[np.ndarray] | None = None) -> int:
        """Swap faces from one or more frames, batching up to `max_batch` faces per model call.

        `sources` gives each item its own identity (from `identity`), so that faces of streams
        with different source faces share one model call; without it every face gets the one
        from `set_source`."""
        if sources is None and self._source is None:
            raise RuntimeError("NeuralSwapper.swap called before set_source")
        if sources is not None and len(sources) != len(items):
            raise ValueError(f"swap_many: {len(sources)} sources for {len(items)} faces")
        done = 0
        for start in range(0, len(items), self.max_batch):
            end = start + self.max_batch
            done += self._swap_batch(items[start:end], None if sources is None else sources[start:end])
        return done

    def _swap_batch(self, items: list[tuple[Any, Face]], sources: list[np.ndarray] | None = None) -> int:
        c = self.contract
        n = len(items)
        if n == 0:
            return 0
        xp = get_xp(items[0][0])
        s = c.size
        batch = xp.empty((n, 3, s, s), xp.float32)
        to_frame = [invert_affine(align_matrix(face.kps, c.template, s)) for _, face in items]
        # One crop launch per run of faces from the same frame, written straight into its slice of
        # the batch (callers pass faces frame by frame, so each frame is one run).
        start = 0
        while start < n:
            end = start + 1
            while end < n and items[end][0] is items[start][0]:
                end += 1
            mats = xp.asarray(np.stack(to_frame[start:end]).astype(np.float32))
            crop_batch(items[start][0], mats, batch[start:end], mean=c.mean, std=c.std)
            start = end
        keep = None
        if self.masker is not None and self.masker.active:
            # The masks read the target crop just made (FaceFusion masks the target, before the
            # swap): undo the normalisation rather than crop the frame a second time.
            target = (batch.transpose(0, 2, 3, 1) * per_channel(c.std, xp) + per_channel(c.mean, xp)) * 255.0
            points = None
            if self.masker.areas:
                points = [crop_points68(face, to_frame[i]) for i, (_, face) in enumerate(items)]
            keep = 1.0 - self.masker.mask(target, points)
        source = xp.asarray(np.concatenate(sources, axis=0) if sources is not None
                            else np.repeat(self._source, n, axis=0))
        if self.runner.wants_device_arrays and xp is np:
            import cupy

            batch, source = cupy.asarray(batch), cupy.asarray(source)
        # On the GPU the model runs on the caller's current CuPy stream, ordered after the crop.
        stream = None
        if xp is not np:
            stream = xp.cuda.get_current_stream()
        out = self.runner.infer({c.target_name: batch, c.source_name: source}, stream)
        y = next(iter(out.values()))
        # A GPU runner may return device arrays for host frames (and the reverse): meet the frames.
        y = xp.asarray(y.get() if xp is np and hasattr(y, "get") else y, dtype=xp.float32)
        self.batches_run += 1
        if c.output_range == "std_mean":
            y = y * per_channel(c.std, xp, (1, -1, 1, 1)) + per_channel(c.mean, xp, (1, -1, 1, 1))
        crops = xp.ascontiguousarray(xp.clip(y, 0.0, 1.0).transpose(0, 2, 3, 1) * 255.0)
        if self.enhancer is not None and self.enhancer.enabled:
            self._enhance_and_paste(items, crops, keep, to_frame)
            return n
        for i, (frame, _face) in enumerate(items):
            paste_back(frame, crops[i], to_frame[i], blur=self.blur, padding=self.padding,
                       keep_out=None if keep is None else xp.ascontiguousarray(keep[i]))
        return n

    def _enhance_and_paste(self, items: list[tuple[Any, Face]], crops: Any, keep: Any,
                           to_frame: list[np.ndarray]) -> None:
        """Enhance the swapped crops and paste each face once, through the swap's mask."""
        enh = self.enhancer
        assert enh is not None
        xp = get_xp(crops)
        s = self.contract.size
        # The swap's own paste mask, in its crop: the box (blur, padding) times the model masks.
        box = box_mask(xp.empty((s, s), xp.float32), blur=self.blur, padding=self.padding)
        masks = box[None] if keep is None else box[None] * (1.0 - keep)
        masks = xp.broadcast_to(masks, (len(items), s, s))
        e = int(enh.spec.size)  # type: ignore[arg-type]
        enh_to_frame = [invert_affine(align_matrix(face.kps, enh.template, e)) for _, face in items]
        # Enhancer crop pixel -> frame pixel -> swap crop pixel.
        enh_to_swap = [compose(invert_affine(to_frame[i]), enh_to_frame[i]) for i in range(len(items))]
        out, pmask = enh.enhance(crops, masks, enh_to_swap)
        for i, (frame, _face) in enumerate(items):
            # blur 0: the paste's own box is then a one-pixel frame; the swap's box is in `pmask`.
            paste_back(frame, out[i], enh_to_frame[i], blur=0.0,
                       keep_out=xp.ascontiguousarray(1.0 - pmask[i]))
