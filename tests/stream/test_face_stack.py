"""The neural face stack on the CPU: the occluder and parser test models (real architectures, from
tools/make_face_models.py), the torch runner against ONNX Runtime on them, the masks in the swapper's
paste-back, and `swapstream run` with them end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, read_frames, write_demo_clip  # noqa: E402
from swapstream.engines.ort_runner import OnnxRuntimeRunner  # noqa: E402
from swapstream.engines.torch_runner import TorchRunner  # noqa: E402
from swapstream.engines.zoo import TEMPLATES, get_spec  # noqa: E402
from swapstream.face.analyser import FaceAnalyser  # noqa: E402
from swapstream.types import Face  # noqa: E402
from swapstream.neural.face_stack import (MESH_TO_68, FaceEnhancer, FaceMasker, per_channel, prepare,  # noqa: E402
                                          region_classes, resize_bilinear)
from swapstream.neural.swapper import Embedder, NeuralSwapper, SwapContract, align_matrix  # noqa: E402

from ..zoo_models import copy_builtin, place, stack_models  # noqa: E402
from ..zoo_models import make_face_models as fm  # noqa: E402
from ..zoo_models import make_test_models as tm  # noqa: E402

FP32_REL_L2 = 1e-5
"""Torch (CPU, fp32) against ONNX Runtime (CPU): same arithmetic up to summation order."""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stack_models(tmp_path_factory.mktemp("face_stack") / "models")


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory, models: Path) -> Path:
    """The same architectures with weights that make known masks: green is an occluder, all is skin
    (and the random GFPGAN of `models`, linked rather than written twice)."""
    d = tmp_path_factory.mktemp("face_stack_crafted") / "models"
    d.mkdir()
    for f in ("gfpgan_1.4.onnx", "gfpgan_1.4.hash"):
        os.link(models / f, d / f)
    copy_builtin(d)
    place(d, "arcface_w600k_r50", tm.arcface_stub(seed=0))
    place(d, "inswapper_128", tm.inswapper(width=8, blocks=1, seed=2))
    place(d, "xseg_1", fm.xseg_green_occluder())
    place(d, "bisenet_resnet_18", fm.bisenet_all_skin(seed=0))
    return d


@pytest.mark.parametrize("name,shape", [("xseg_1", (2, 256, 256, 3)), ("bisenet_resnet_18", (2, 3, 512, 512)),
                                        ("gfpgan_1.4", (1, 3, 512, 512))])
def test_torch_runner_matches_onnxruntime_fp32(models: Path, name: str, shape: tuple[int, ...]) -> None:
    path = models / f"{name}.onnx"
    ort, tr = OnnxRuntimeRunner(path), TorchRunner(path, device="cpu", precision="fp32")
    ort.activate()
    tr.activate()
    assert tr.architecture == name.split("_")[0]  # the native module, not a fallback
    x = np.random.default_rng(1).random(shape, dtype=np.float32)
    if name.startswith("gfpgan"):
        x = x * 2 - 1  # its input range
    want = next(iter(ort.infer({"input": x}).values()))
    got = next(iter(tr.infer({"input": x}).values()))
    assert got.shape == want.shape
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= FP32_REL_L2
    if name.startswith("bisenet"):
        # The runner reads the fused head (FaceFusion's first output): it must be the first one.
        assert [o.name for o in tr.outputs] == ["output"]
        assert (got.argmax(1) == want.argmax(1)).mean() > 0.999


def test_contracts_of_the_test_models(models: Path) -> None:
    import onnx

    for name, ins, outs in (("xseg_1", [["batch", 256, 256, 3]], [["batch", 256, 256, 1]]),
                            ("bisenet_resnet_18", [["batch", 3, 512, 512]], [["batch", 19, 512, 512]] * 3)):
        g = onnx.load(str(models / f"{name}.onnx")).graph
        dims = lambda vs: [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in vs]  # noqa: E731
        assert [i.name for i in g.input] == ["input"]
        assert dims(g.input) == ins and dims(g.output) == outs


def test_prepare_follows_each_contract() -> None:
    crops = np.zeros((1, 4, 4, 3), np.float32)
    crops[..., 0] = 255.0  # pure red
    x = prepare(crops, get_spec("xseg_1"))
    assert x.shape == (1, 256, 256, 3)
    np.testing.assert_allclose(x[0, 0, 0], [0.0, 0.0, 1.0])  # BGR, /255, NHWC
    y = prepare(crops, get_spec("bisenet_resnet_18"))
    assert y.shape == (1, 3, 512, 512)
    np.testing.assert_allclose(y[0, :, 0, 0], [(1 - .485) / .229, -.456 / .224, -.406 / .225], rtol=1e-6)


def test_per_channel_constants_round_as_arrays_do() -> None:
    """A shared mean/std goes in as a Python float (no device copy on the GPU); it must give the
    very bits that the float32 array of it gives, and distinct values must stay an array."""
    x = np.random.default_rng().uniform(0, 255, (2, 8, 8, 3)).astype(np.float32)
    for v in (0.5, 0.485, 1 / 3):
        f = per_channel([v, v, v], np)
        assert isinstance(f, float)
        arr = np.full(3, v, np.float32)
        np.testing.assert_array_equal((x / 255.0 - f) / f, (x / 255.0 - arr) / arr)
        assert ((x / 255.0 - f) / f).dtype == np.float32
    a = per_channel([0.485, 0.456, 0.406], np, (1, -1, 1, 1))
    assert a.shape == (1, 3, 1, 1) and a.dtype == np.float32


def test_resize_bilinear_matches_cv2() -> None:
    import cv2

    x = np.random.default_rng(0).random((1, 37, 37, 1), dtype=np.float32)
    for size in (16, 128):
        want = cv2.resize(x[0, :, :, 0], (size, size), interpolation=cv2.INTER_LINEAR)
        np.testing.assert_allclose(resize_bilinear(x, size)[0, :, :, 0], want, atol=1e-5)


def test_region_names() -> None:
    assert region_classes(["eyes", "nose"]) == (4, 5, 10)
    assert region_classes(["skin", "left-eyebrow", "skin"]) == (1, 2)


# --------------------------------------------------------------------------------------------------
# Occluded pixels keep the target, through real inference in the real swap path


def _target_and_source(models: Path) -> tuple[np.ndarray, Face, Face]:
    """The Grace Hopper portrait (a copy to paint on), its face, and the astronaut's face."""
    frame = grace_hopper().copy()
    analyser = FaceAnalyser(load_config(overrides=[f"models_dir={models}"]), models)
    try:
        return frame, analyser.analyse_image(frame)[0], analyser.analyse_image(astronaut())[0]
    finally:
        analyser.close()


def _swapper(models: Path, masker: FaceMasker | None) -> NeuralSwapper:
    spec = get_spec("inswapper_128")
    contract = SwapContract(size=128, template=TEMPLATES["arcface_128"], mean=spec.mean, std=spec.std,
                            embedding="normalized", output_range="0_1_clip")
    runner = OnnxRuntimeRunner(models / "inswapper_128.onnx")
    runner.activate()
    emb = OnnxRuntimeRunner(models / "arcface_w600k_r50.onnx")
    emb.activate()
    return NeuralSwapper(contract, runner, Embedder(emb, TEMPLATES["arcface_112_v2"]), masker=masker)


def test_occluded_pixels_keep_the_target(crafted: Path) -> None:
    models = crafted
    frame, face, source = _target_and_source(models)
    # Paint a green occluder over one cheek, inside the swapper's crop.
    m = align_matrix(face.kps, TEMPLATES["arcface_128"], 128)
    inv = cv2_invert(m)
    (x0, y0), (x1, y1) = (inv @ [40, 70, 1]).astype(int), (inv @ [62, 95, 1]).astype(int)
    frame[y0:y1, x0:x1] = (20, 230, 20)

    occ = OnnxRuntimeRunner(models / "xseg_1.onnx")  # the crafted "green is an occluder" XSeg
    occ.activate()
    results = {}
    for label, masker in (("plain", None), ("masked", FaceMasker(occluder=occ, occluder_spec=get_spec("xseg_1")))):
        sw = _swapper(models, masker)
        sw.set_source(astronaut(), source)
        out = frame.copy()
        assert sw.swap(out, [face]) == 1
        results[label] = np.abs(out.astype(int) - frame.astype(int)).max(axis=2)
    # FaceFusion's softening (blur sigma 5 crop pixels, then [0.5, 1] -> [0, 1]) leaves a convex corner
    # of an occluder partly painted up to about 0.55 sigma inside it, and the paste samples the mask
    # bilinearly: 5 crop pixels in from the painted edge, every pixel must be the target's.
    margin = int(np.ceil(5 / np.sqrt(abs(np.linalg.det(m[:, :2])))))
    inner = (slice(y0 + margin, y1 - margin), slice(x0 + margin, x1 - margin))
    assert results["plain"][inner].size > 50
    # Without the mask the swap paints over the occluder; with it every occluder pixel is the target's.
    assert (results["plain"][inner] > 30).mean() > 0.5
    assert results["masked"][inner].max() == 0
    # Elsewhere on the face the masked swap still paints.
    (cx, cy) = (inv @ [64, 50, 1]).astype(int)
    assert results["masked"][cy - 5:cy + 5, cx - 5:cx + 5].mean() > 10


def test_region_mask_paints_only_the_chosen_parts(crafted: Path) -> None:
    """The crafted parser calls every pixel skin: with `skin` chosen the swap paints, with only `nose`
    chosen it may paint nothing, through real inference of the parser in the swap path."""
    frame, face, source = _target_and_source(crafted)
    parser = OnnxRuntimeRunner(crafted / "bisenet_resnet_18.onnx")
    parser.activate()
    changed = {}
    for regions in (["skin"], ["nose"]):
        masker = FaceMasker(parser=parser, parser_spec=get_spec("bisenet_resnet_18"),
                            regions=region_classes(regions))
        sw = _swapper(crafted, masker)
        sw.set_source(astronaut(), source)
        out = frame.copy()
        sw.swap(out, [face])
        changed[regions[0]] = int((np.abs(out.astype(int) - frame.astype(int)).max(axis=2) > 0).sum())
    assert changed["skin"] > 1000 and changed["nose"] == 0


def test_bad_face_stack_names_give_one_line() -> None:
    from swapstream.errors import ConfigError

    for item, known in (("enhancer=gfpgan_9", "gfpgan_1.4"), ("mask.parser=bisenet_9", "bisenet_resnet_18"),
                        ("mask.regions=skin,hair", "'nose'")):
        with pytest.raises(ConfigError) as e:
            load_config(overrides=[item])
        msg = str(e.value)
        assert "\n" not in msg and item.split("=")[0] in msg and known in msg


def test_enhancer_shares_the_swap_paste(models: Path) -> None:
    """Blend 0 must give the plain swap (the enhancer's crop-to-crop warp and single paste change
    nothing but resampling); blend 1 repaints inside the swap's mask and nowhere else."""
    frame, face, source = _target_and_source(models)
    runner = OnnxRuntimeRunner(models / "gfpgan_1.4.onnx")
    runner.activate()
    spec = get_spec("gfpgan_1.4")
    outs = {}
    for label, enh in (("plain", None),
                       ("blend0", FaceEnhancer(runner, spec, TEMPLATES["ffhq_512"], blend=0.0)),
                       ("blend1", FaceEnhancer(runner, spec, TEMPLATES["ffhq_512"], blend=1.0))):
        sw = _swapper(models, None)
        sw.enhancer = enh
        sw.set_source(astronaut(), source)
        out = frame.copy()
        sw.swap(out, [face])
        outs[label] = out.astype(int)
    swapped = np.abs(outs["plain"] - frame.astype(int)).max(axis=2) > 30
    assert swapped.sum() > 1000
    d0 = np.abs(outs["blend0"] - outs["plain"]).max(axis=2)
    d1 = np.abs(outs["blend1"] - outs["plain"]).max(axis=2)
    # Two bilinear resamplings (128 -> 512 -> frame) against one, on a random model's busy output.
    assert np.median(d0[swapped]) <= 3 and np.median(d1[swapped]) > 5 * max(1.0, np.median(d0[swapped]))
    # Outside the swap's reach nothing moves, enhanced or not.
    untouched = np.abs(outs["plain"] - frame.astype(int)).max(axis=2) == 0
    grown = cv2_dilate(~untouched, 9)
    assert (d1[~grown] == 0).all()


def cv2_dilate(mask: np.ndarray, k: int) -> np.ndarray:
    import cv2

    return cv2.dilate(mask.astype(np.uint8), np.ones((k, k), np.uint8)) > 0


def cv2_invert(m: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.invertAffineTransform(m)


# --------------------------------------------------------------------------------------------------
# swapstream run, end to end


def _run(models: Path, tmp: Path, name: str, *sets: str) -> Path:
    import cv2

    clip = tmp / "clip.mp4"
    if not clip.exists():
        write_demo_clip(clip, grace_hopper(), seconds=0.3, fps=10, size=(640, 360))
        cv2.imwrite(str(tmp / "source.png"), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    out = tmp / f"{name}.mp4"
    args = ["run", "-s", tmp / "source.png", "-i", clip, "-o", out, "--models-dir", models,
            "--set", "swapper=inswapper_128", "--set", "neural.download=false",
            "--set", "neural.runner=onnxruntime"]
    for item in sets:
        args += ["--set", item]
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_run_with_occlusion_and_region_masks(crafted: Path, tmp_path: Path) -> None:
    # The clip has no green and the parser calls everything skin: the masks must let the whole swap
    # through, so the output is the box-only one up to x264's noise.
    masked = _run(crafted, tmp_path, "masked", "mask.types=box,occlusion,region",
                  "mask.regions=skin,nose,mouth,eyes,eyebrows")
    box = _run(crafted, tmp_path, "box", "mask.types=box")
    a, b, c = (read_frames(p, [0, 2]) for p in (tmp_path / "clip.mp4", box, masked))
    for i in a:
        swapped = np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2) > 40
        assert swapped.sum() > 500
        same = np.abs(b[i].astype(int) - c[i].astype(int)).max(axis=2)
        change = np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2)[swapped]
        q, qc = np.percentile(same[swapped], [50, 90]), np.percentile(change, [50, 90])
        # x264 re-encodes the random model's high-frequency output differently for any change of
        # input, so compare against the size of the swap itself rather than against zero.
        assert q[0] <= 0.1 * qc[0] and q[1] <= 0.2 * qc[1], (q, qc)


def test_run_with_masks_and_the_gfpgan_enhancer(crafted: Path, tmp_path: Path) -> None:
    """The issue's command: `swapstream run --set mask.types=occlusion,region --set enhancer=gfpgan_1.4`
    on the test models (random GFPGAN v1.4 architecture): the enhancer repaints the swapped face, and
    only there."""
    enhanced = _run(crafted, tmp_path, "enhanced", "mask.types=occlusion,region", "enhancer=gfpgan_1.4")
    plain = _run(crafted, tmp_path, "plain", "mask.types=occlusion,region")
    a, b, c = (read_frames(p, [0, 2]) for p in (tmp_path / "clip.mp4", plain, enhanced))
    for i in a:
        swapped = np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2) > 40
        assert swapped.sum() > 500
        moved = np.abs(b[i].astype(int) - c[i].astype(int)).max(axis=2)
        assert np.median(moved[swapped]) > 20  # random weights: the "enhancement" is a repaint
        far = ~cv2_dilate(np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2) > 12, 31)
        assert np.percentile(moved[far], 99) <= 12  # x264's noise only, away from the face


def test_area_mask_needs_the_built_in_mesh_and_names_the_fix(models: Path) -> None:
    from swapstream.neural.factory import NeuralStages
    from swapstream.engines.errors import EngineUserError

    cfg = load_config(overrides=["swapper=inswapper_128", "neural.download=false", f"models_dir={models}",
                                 "neural.runner=onnxruntime", "mask.types=box,area",
                                 "neural.detector=scrfd_2.5g"])
    with pytest.raises(EngineUserError, match="use --set neural.detector=builtin"):
        NeuralStages(cfg)


def test_the_68_points_taken_from_the_mesh_sit_where_the_scheme_puts_them() -> None:
    cfg = load_config()
    analyser = FaceAnalyser(cfg)
    try:
        face = analyser.analyse_image(grace_hopper())[0]
    finally:
        analyser.close()
    assert face.landmarks is not None
    p = face.landmarks[MESH_TO_68, :2]
    assert len(MESH_TO_68) == 68 and len(set(MESH_TO_68.tolist())) == 68
    jaw, brows, eyes, mouth = p[0:17], p[17:27], p[36:48], p[48:68]
    # The chin (8) is the jaw's lowest point, the jaw runs from image left (0) to image right (16).
    assert jaw[:, 1].argmax() == 8 and jaw[0, 0] < jaw[8, 0] < jaw[16, 0]
    assert (np.diff(jaw[:9, 1]) > 0).all() and (np.diff(jaw[8:, 1]) < 0).all()
    # Brows above the eyes, eyes above the nose tip (30), the nose tip above the mouth.
    assert brows[:, 1].max() < eyes[:, 1].min() and eyes[:, 1].max() < p[30, 1] < mouth[:, 1].min()
    # Left-hand features on the image's left: brow 17-21, eye 36-41, mouth corner 48.
    assert brows[:5, 0].max() < brows[5:, 0].min() and eyes[:6, 0].max() < eyes[6:, 0].min()
    assert p[48, 0] < p[51, 0] < p[54, 0] and p[51, 1] < p[57, 1]
    # Mirror pairs about the face's axis (the portrait is near frontal): 0/16, 36/45, 48/54.
    mid = (p[27, 0] + p[8, 0]) / 2
    width = p[16, 0] - p[0, 0]
    for a, b in ((0, 16), (36, 45), (48, 54), (31, 35)):
        assert abs((p[a, 0] + p[b, 0]) / 2 - mid) < 0.08 * width, (a, b)


def test_area_mask_paints_only_its_areas(models: Path) -> None:
    """Through the real swap path: with `mouth` alone the swap changes pixels only around the lips'
    hull; with `upper-face` alone it leaves the lips as they were."""
    frame, face, source = _target_and_source(models)
    assert face.landmarks is not None
    import cv2

    lips = cv2.convexHull(np.round(face.landmarks[MESH_TO_68[48:68], :2]).astype(np.int32))
    inside = np.zeros(frame.shape[:2], np.uint8)
    cv2.fillConvexPoly(inside, lips, 1)
    # FaceFusion's softening (blur sigma 5 crop pixels, then [0.5, 1] -> [0, 1]) never paints
    # outside the hull by more than the blur's reach, and clips to 0 the hull's thin parts (the
    # lips' corners, narrower than about 2 sigma); the paste samples the mask bilinearly.
    m = align_matrix(face.kps, TEMPLATES["arcface_128"], 128)
    sigma = 5 / np.sqrt(abs(np.linalg.det(m[:, :2])))  # 5 crop pixels, in frame pixels
    near = cv2_dilate(inside.astype(bool), 2 * int(np.ceil(3 * sigma)) + 1)
    k = 2 * int(np.ceil(3 * sigma)) + 1
    core = cv2.erode(inside, np.ones((k, k), np.uint8)).astype(bool)
    changed = {}
    for areas in (("mouth",), ("upper-face",), ("upper-face", "lower-face", "mouth")):
        sw = _swapper(models, FaceMasker(areas=areas))
        sw.set_source(astronaut(), source)
        out = frame.copy()
        assert sw.swap(out, [face]) == 1
        changed[areas[0] if len(areas) == 1 else "all"] = np.abs(out.astype(int) - frame.astype(int)).max(axis=2)
    # Most of the lips are swapped (here the lips are about 3 sigma high: their edges clip to 0).
    assert inside.sum() > 200 and (changed["mouth"][inside.astype(bool)] > 0).mean() > 0.5
    assert changed["mouth"][~near].max() == 0                        # and nothing far from them
    assert (changed["all"][~near] > 0).sum() > 2000                   # the whole face is, with all three
    if core.any():
        # The upper face's hull ends at the nostrils: the lips' inner part keeps the target.
        assert changed["upper-face"][core].max() == 0


def test_run_with_the_area_mask(models: Path, tmp_path: Path) -> None:
    """`swapstream run --set mask.types=box,area --set mask.areas=mouth` end to end: the output
    differs from the input around the mouth only."""
    out = _run(models, tmp_path, "area", "mask.types=box,area", "mask.areas=mouth")
    a, b = (read_frames(p, [0, 2]) for p in (tmp_path / "clip.mp4", out))
    cfg = load_config()
    analyser = FaceAnalyser(cfg)
    try:
        for i in a:
            face = analyser.analyse_image(a[i])[0]
            assert face.landmarks is not None
            box = face.landmarks[MESH_TO_68[48:68], :2]
            (x0, y0), (x1, y1) = box.min(axis=0), box.max(axis=0)
            diff = np.abs(a[i].astype(int) - b[i].astype(int)).max(axis=2)
            pad = 0.6 * (x1 - x0)  # the mask's blur and the lips' own motion between frames
            far = np.ones(diff.shape, bool)
            far[max(0, int(y0 - pad)):int(y1 + pad), max(0, int(x0 - pad)):int(x1 + pad)] = False
            mouth = diff[int(y0):int(y1), int(x0):int(x1)]
            # Random weights repaint the lips; the softened mask clips their thin parts to 0 and the
            # box around them holds skin too.
            assert (mouth > 20).mean() > 0.1, (mouth > 20).mean()  # 0.21 measured
            # Elsewhere x264's noise only (p99 13 measured: the input clip is itself an encode) and
            # none of the swap's repaint, which moves pixels by more than 40.
            assert np.percentile(diff[far], 99) <= 16 and (diff[far] > 40).mean() < 1e-3
    finally:
        analyser.close()


def test_runtime_backend_skips_parser_and_enhancer_for_stepped_down_streams(crafted: Path) -> None:
    from swapstream.demo import render_target_frame
    from swapstream.runtime.swappers import NeuralBackend, SwapItem

    cfg = load_config("multi_stream", ["neural.download=false", "neural.runner=onnxruntime",
                                       f"models_dir={crafted}", "mask.types=box,occlusion,region",
                                       "enhancer=gfpgan_1.4"])
    backend = NeuralBackend("inswapper_128", cfg)
    try:
        img = render_target_frame(grace_hopper(), 0.0, (320, 240))
        faces = backend._analyser.analyse_image(img)
        ident = backend.identity(astronaut())
        masker, enhancer = backend.swapper.masker, backend.swapper.enhancer
        assert masker is not None and enhancer is not None
        full = SwapItem(img.copy(), faces, ident)
        stepped = SwapItem(img.copy(), faces, ident, region=False, enhance=False)
        assert backend.swap([full, stepped]) == [1, 1]
        # Two model calls: occluder + parser for the full stream's batch, occluder alone for the
        # stepped-down one; the enhancer once, for the full stream only.
        assert (masker.calls, enhancer.calls) == (3, 1)
        assert masker.use_region and enhancer.enabled  # restored for the next batch
        assert np.abs(full.frame.astype(int) - stepped.frame.astype(int)).max() > 20
    finally:
        backend.close()


@pytest.mark.gpu
def test_masker_on_cupy_crops_matches_numpy(tmp_path: Path, cp: object) -> None:
    """The masks' glue on the GPU (resize, normalise, the fused blur of the feather, the minimum of
    the masks) against the NumPy path, with the same ONNX Runtime models (the runner reads the CuPy
    crops back to the host), on fresh random crops of a batch of 3. Only the two mask models are
    built: the GPU machine has no built-in models for the `models` fixture."""
    import cupy

    place(tmp_path, "xseg_1", fm.xseg(seed=0))
    place(tmp_path, "bisenet_resnet_18", fm.bisenet(seed=0))
    occ = OnnxRuntimeRunner(tmp_path / "xseg_1.onnx")
    parser = OnnxRuntimeRunner(tmp_path / "bisenet_resnet_18.onnx")
    occ.activate()
    parser.activate()
    # Many regions: a random parser's labels rarely fall in one or two classes.
    regions = region_classes(["skin", "eyebrows", "eyes", "glasses", "nose", "mouth", "lips"])
    crops = np.random.default_rng().uniform(0, 255, (3, 128, 128, 3)).astype(np.float32)
    for masker in (FaceMasker(occluder=occ, occluder_spec=get_spec("xseg_1")),
                   FaceMasker(occluder=occ, occluder_spec=get_spec("xseg_1"), parser=parser,
                              parser_spec=get_spec("bisenet_resnet_18"), regions=regions)):
        ref = masker.mask(crops)
        got = masker.mask(cupy.asarray(crops)).get()
        assert ref.shape == got.shape == (3, 128, 128)
        # Every GPU step rounds as its NumPy twin (the blur and resize kernels bit for bit, the rest
        # IEEE element-wise float32), so the masks agree to the last bits; 1e-6 allows a last-ulp
        # difference in the normalisation's division, should CuPy's differ from NumPy's.
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
        assert float(ref.max()) > float(ref.min())  # not a constant mask, which would hide a broken step
