"""The neural face stack's masks: occlusion (XSeg) and region (BiSeNet) on the swapper's aligned crop.

FaceFusion's `face_mask_types` (docs/neural.md, "Masks and paste-back"): `box` is the paste-back's own
blurred box mask; `occlusion` and `region` come from zoo models run on the crop the swapper already
made (the target, before the swap), resized to each model's size as FaceFusion does, so no second crop
of the frame is taken. Their masks are resized back to the crop, softened (blur sigma 5, then
[0.5, 1] -> [0, 1], FaceFusion's post-processing) and combined with an element-wise minimum; the
paste-back then multiplies its box mask by that (its `keep_out` is one minus it).

Array code is written against `xp` (NumPy or CuPy), so on a GPU the crops and masks stay on the device;
the models run through the same `Runner`s as the swapper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engines.runner import Runner
from ..engines.zoo import ModelSpec
from ..kernels._xp import get_xp
from ..kernels.mask import feather
from ..kernels.resize import resize_bilinear

MASK_SIGMA = 5.0
"""FaceFusion blurs the occlusion, region and area masks with sigma 5 (crop pixels) before the clip."""

REGION_CLASSES: dict[str, tuple[int, ...]] = {
    # FaceFusion's face_mask_region_set (BiSeNet's CelebAMask-HQ classes).
    "skin": (1,), "left-eyebrow": (2,), "right-eyebrow": (3,), "left-eye": (4,), "right-eye": (5,),
    "glasses": (6,), "nose": (10,), "mouth": (11,), "upper-lip": (12,), "lower-lip": (13,),
    # Shorthands for both sides.
    "eyebrows": (2, 3), "eyes": (4, 5), "lips": (12, 13),
}
"""Names `mask.regions` accepts, and the parser classes each one selects."""


AREA_POINTS: dict[str, tuple[int, ...]] = {
    # FaceFusion's face_mask_area_set: indices into the 68-point (iBUG 300-W) landmark scheme.
    "upper-face": (0, 1, 2, 31, 32, 33, 34, 35, 14, 15, 16, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17),
    "lower-face": (3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 35, 34, 33, 32, 31),
    "mouth": tuple(range(48, 68)),
}
"""Names `mask.areas` accepts, and the 68-point landmarks whose convex hull each one is."""

MESH_TO_68 = np.array([
    # Jaw, 0-16, from the image-left end (the subject's right) over the chin (8).
    127, 234, 93, 132, 58, 172, 136, 149, 152, 378, 365, 397, 288, 361, 323, 454, 356,
    # Brows: 17-21 from the image-left brow's outer end inwards, 22-26 from the image-right
    # brow's inner end outwards.
    70, 63, 105, 66, 107, 336, 296, 334, 293, 300,
    # Nose bridge 27-30 (top to tip), nostrils 31-35 (image left to right).
    168, 197, 5, 4, 98, 97, 2, 326, 327,
    # Eyes, 36-41 and 42-47: outer corner, upper lid (2), inner corner, lower lid (2).
    33, 160, 158, 133, 153, 144, 362, 385, 387, 263, 373, 380,
    # Outer lips 48-59 from the left corner over the top, inner lips 60-67.
    61, 40, 37, 0, 267, 270, 291, 321, 314, 17, 84, 91, 78, 81, 13, 311, 308, 402, 14, 178,
])
"""For each of the 68 points, the Face Mesh vertex at the same place on the face (the canonical
mesh's landmark positions; mirror pairs such as 234/454 and 61/291 map to mirror points). The
built-in analyser gives the mesh; `area` masks take their 68 points from it."""


def area_mask(points68: np.ndarray, size: int, areas: tuple[str, ...]) -> np.ndarray:
    """(size, size) float32, 1 inside the convex hull of the 68-point landmarks of `areas` (crop
    pixels), 0 elsewhere: FaceFusion's `create_area_mask` before its blur (which `FaceMasker` applies
    to every mask alike). Filled with 1/16-pixel vertex precision, where FaceFusion truncates the
    points to whole pixels."""
    import cv2

    idx = sorted({i for a in areas for i in AREA_POINTS[a]})
    hull = cv2.convexHull(np.round(points68[idx, :2] * 16).astype(np.int32))
    out = np.zeros((size, size), np.float32)
    cv2.fillConvexPoly(out, hull, 1.0, cv2.LINE_8, shift=4)
    return out


def crop_points68(face: Any, to_frame: np.ndarray) -> np.ndarray:
    """(68, 2) float64: the face's 68-point landmarks (from its Face Mesh, MESH_TO_68) in the pixels of
    the crop whose crop -> frame map is `to_frame`."""
    from ..kernels.warp import invert_affine

    lm = face.landmarks
    if lm is None or len(lm) <= int(MESH_TO_68.max()):
        raise ValueError("an area mask needs the face mesh's landmarks (the built-in analyser's); "
                         "this face has none")
    m = invert_affine(np.asarray(to_frame, np.float64))
    xy = np.asarray(lm, np.float64)[MESH_TO_68, :2]
    return xy @ m[:, :2].T + m[:, 2]


def region_classes(names: list[str] | tuple[str, ...]) -> tuple[int, ...]:
    """The sorted parser classes of the region names (validated by the config)."""
    return tuple(sorted({c for n in names for c in REGION_CLASSES[n]}))


def per_channel(values: tuple[float, ...] | list[float], xp: Any, shape: tuple[int, ...] = (-1,)) -> Any:
    """Per-channel constants (a model's mean or std) to broadcast against an array: a Python float
    when every channel has the same value, as all our zoo's do, so that the GPU path makes no
    host-to-device copy for them; otherwise a float32 array of `shape`. Both round as float32 (a
    Python float meets a float32 array as float32: NEP 50), so the results are the same."""
    v = [float(x) for x in values]
    if v and all(x == v[0] for x in v):
        return float(np.float32(v[0]))
    return xp.asarray(v, dtype=xp.float32).reshape(shape)


def prepare(crops: Any, spec: ModelSpec) -> Any:
    """A model's input from (N, S, S, 3) RGB crops in [0, 255]: resized to its size, in its channel
    order, normalised as (x/255 - mean)/std, in its layout."""
    xp = get_xp(crops)
    size = spec.size or crops.shape[1]
    x = resize_bilinear(crops, size)
    mean, std = per_channel(spec.mean, xp), per_channel(spec.std, xp)
    x = (x / 255.0 - mean) / std  # mean/std are in the model's channel order (all ours are symmetric)
    if spec.channels == "BGR":
        x = x[..., ::-1]
    if spec.layout == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return xp.ascontiguousarray(x, dtype=xp.float32)


def _to_runner(runner: Runner, a: Any) -> Any:
    """`a` where `runner` can read it: TensorRT wants device arrays; ONNX Runtime on the CPU host
    ones (the torch runner takes either)."""
    on_gpu = type(a).__module__.startswith("cupy")
    if runner.wants_device_arrays and not on_gpu:
        import cupy

        return cupy.asarray(a)
    if on_gpu and runner.name == "onnxruntime":
        return a.get()
    return a


def _first_output(runner: Runner, feed: dict[str, Any], xp: Any) -> Any:
    out = runner.infer({k: _to_runner(runner, v) for k, v in feed.items()})
    y = out[runner.outputs[0].name] if runner.outputs and runner.outputs[0].name in out \
        else next(iter(out.values()))
    return xp.asarray(y.get() if xp is np and hasattr(y, "get") else y, dtype=xp.float32)


@dataclass
class FaceMasker:
    """Computes the occlusion and region masks of a batch of aligned target crops."""

    occluder: Runner | None = None
    occluder_spec: ModelSpec | None = None
    parser: Runner | None = None
    parser_spec: ModelSpec | None = None
    regions: tuple[int, ...] = ()
    """Parser classes that the swap may paint (`region_classes`)."""
    use_region: bool = True
    """Whether the region mask is computed; the degradation ladder turns it off first among masks."""
    areas: tuple[str, ...] = ()
    """With `area` in mask.types: the areas (AREA_POINTS) the swap may paint; () computes no area mask."""
    calls: int = 0
    """Model calls made, for statistics."""

    def __post_init__(self) -> None:
        if (self.occluder is None) != (self.occluder_spec is None) or \
                (self.parser is None) != (self.parser_spec is None):
            raise ValueError("FaceMasker: each model needs both its runner and its zoo entry")
        if self.parser is not None and not self.regions:
            raise ValueError("FaceMasker: a region mask needs at least one region (mask.regions)")

    @property
    def active(self) -> bool:
        return self.occluder is not None or (self.parser is not None and self.use_region) or bool(self.areas)

    def mask(self, crops: Any, points68: list[np.ndarray] | None = None) -> Any:
        """(N, S, S) float32 in [0, 1], 1 where the swap may paint, for (N, S, S, 3) RGB target crops
        in [0, 255]; None when no mask is active. `points68`: each face's 68-point landmarks in its
        crop's pixels, which an area mask needs."""
        if not self.active:
            return None
        xp = get_xp(crops)
        s = crops.shape[1]
        masks = []
        if self.areas:
            if points68 is None or len(points68) != crops.shape[0]:
                raise ValueError("FaceMasker.mask: an area mask needs each face's 68 landmarks")
            # Filled on the host from the landmarks (host data) and sent up once: (N, S, S, 1), a
            # few tens of kilobytes per face.
            masks.append(xp.asarray(np.stack([area_mask(p, s, self.areas) for p in points68])[..., None]))
        if self.occluder is not None and self.occluder_spec is not None:
            y = _first_output(self.occluder, {self.occluder.inputs[0].name: prepare(crops, self.occluder_spec)}, xp)
            # NHWC (N, size, size, 1) face probability (NCHW (N, 1, size, size) for an NCHW model).
            y = y if self.occluder_spec.layout == "NHWC" else y.transpose(0, 2, 3, 1)
            masks.append(xp.clip(y[..., :1], 0.0, 1.0))
            self.calls += 1
        if self.parser is not None and self.parser_spec is not None and self.use_region:
            logits = _first_output(self.parser, {self.parser.inputs[0].name: prepare(crops, self.parser_spec)}, xp)
            labels = logits.argmax(axis=1)                                   # (N, size, size)
            keep = xp.isin(labels, xp.asarray(self.regions)).astype(xp.float32)
            masks.append(keep[..., None])
            self.calls += 1
        out = None
        for m in masks:
            m = xp.ascontiguousarray(resize_bilinear(m, s)[..., 0].transpose(1, 2, 0))  # (S, S, N)
            soft = feather(xp.clip(m, 0.0, 1.0), MASK_SIGMA, xp.empty_like(m))
            out = soft if out is None else xp.minimum(out, soft)
        assert out is not None
        return xp.ascontiguousarray(out.transpose(2, 0, 1))


def compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The 2x3 affine map `a` after `b` (x -> a(b(x)))."""
    return np.hstack([a[:, :2] @ b[:, :2], (a[:, :2] @ b[:, 2] + a[:, 2])[:, None]])


@dataclass
class FaceEnhancer:
    """A zoo face enhancer (GFPGAN, CodeFormer, GPEN, RestoreFormer++) run on the swapped crop.

    The swap's output, already in the swapper's crop, is resampled into the enhancer's template and
    size (ffhq_512 at 512 for GFPGAN 1.4): a crop-to-crop warp, no second crop of the frame. The
    enhanced face is blended with the unenhanced one by `blend` (FaceFusion's face_enhancer_blend / 100)
    and pasted once, through the swap's own mask (box and model masks) carried into the enhancer's
    crop; the swap and the enhancement share that one paste-back."""

    runner: Runner
    spec: ModelSpec
    template: np.ndarray
    """(5, 2) warp template of `spec.template`, normalised to the crop size."""
    blend: float = 0.8
    weight: float = 0.5
    """Fed to an enhancer with a `weight` input (CodeFormer's fidelity), FaceFusion's default."""
    enabled: bool = True
    """Whether it runs; the degradation ladder's first step turns it off."""
    calls: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.blend <= 1.0:
            raise ValueError(f"enhancer blend must be in [0, 1], got {self.blend}")
        if self.spec.size is None:
            raise ValueError(f"zoo entry '{self.spec.name}' has no size")

    def enhance(self, crops: Any, swap_masks: Any, enh_to_swap: list[np.ndarray]) -> tuple[Any, Any]:
        """Enhanced crops (N, E, E, 3) float32 in [0, 255] and their paste masks (N, E, E), from the
        swapped crops (N, S, S, 3) and their masks (N, S, S), with `enh_to_swap[i]` mapping enhancer
        crop pixels to swap crop pixels."""
        from ..kernels.warp import warp_affine

        xp = get_xp(crops)
        n = crops.shape[0]
        e = int(self.spec.size)  # type: ignore[arg-type]
        up = xp.empty((n, e, e, 3), xp.float32)
        masks = xp.empty((n, e, e, 1), xp.float32)
        for i in range(n):
            # The swap crop's edge is replicated beyond it; the mask (0 outside) keeps that unpasted.
            warp_affine(crops[i], enh_to_swap[i], up[i], border="replicate")
            warp_affine(xp.ascontiguousarray(swap_masks[i][..., None]), enh_to_swap[i], masks[i],
                        border="constant", fill=0.0)
        mean, std = per_channel(self.spec.mean, xp), per_channel(self.spec.std, xp)
        x = xp.ascontiguousarray(((up / 255.0 - mean) / std).transpose(0, 3, 1, 2))
        feed: dict[str, Any] = {}
        for spec_in in self.runner.inputs:
            if spec_in.name == "weight":
                feed["weight"] = np.full((1,), self.weight, dtype=spec_in.dtype)
            else:
                feed[spec_in.name] = x
        y = _first_output(self.runner, feed, xp)                            # (N, 3, E, E)
        self.calls += 1
        if self.spec.output_range == "std_mean":
            # FaceFusion clips to [-1, 1] before de-normalising (normalize_crop_frame).
            y = xp.clip(y, -1.0, 1.0) * per_channel(self.spec.std, xp, (1, -1, 1, 1)) + \
                per_channel(self.spec.mean, xp, (1, -1, 1, 1))
        enhanced = xp.clip(y, 0.0, 1.0).transpose(0, 2, 3, 1) * 255.0
        out = self.blend * enhanced + (1.0 - self.blend) * up
        return xp.ascontiguousarray(out, dtype=xp.float32), xp.ascontiguousarray(masks[..., 0])
