"""The neural swap path on the CPU: alignment, source embeddings, runners, and the identity round trip."""

from __future__ import annotations


import cv2
import numpy as np
import pytest

from swapstream.config import load_config
from swapstream.engines.ort_runner import OnnxRuntimeRunner
from swapstream.engines.torch_models import emap_of
from swapstream.face.analyser import FaceAnalyser
from swapstream.neural.swapper import (Embedder, NeuralSwapper, SwapContract, align_matrix,
                                       source_vector)

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from ..zoo_models import make_test_models as tm  # noqa: E402
from .measures import psnr  # noqa: E402

# arcface_128 and arcface_112_v2 from docs/neural.md, "Warp templates".
ARCFACE_128 = np.array([[.36167656, .40387734], [.63696719, .40235469], [.50019687, .56044219],
                        [.38710391, .72160547], [.61507734, .72034453]], np.float32)
ARCFACE_112_V2 = np.array([[.34191607, .46157411], [.65653393, .45983393], [.500225, .64050536],
                           [.37097589, .82469196], [.63151696, .82325089]], np.float32)


def test_align_matrix_puts_the_points_on_the_template() -> None:
    rng = np.random.default_rng()
    a, s = rng.uniform(-0.5, 0.5), rng.uniform(0.5, 3.0)
    t = rng.uniform(50, 300, 2)
    # Frame points = a similarity transform of the template: the fit must recover it exactly.
    pts = (ARCFACE_128 * 128) @ (s * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])).T + t
    m = align_matrix(pts, ARCFACE_128, 128)
    mapped = pts @ m[:, :2].T + m[:, 2]
    # float32 point storage in OpenCV's fit: ~1e-4 px.
    np.testing.assert_allclose(mapped, ARCFACE_128 * 128, atol=1e-3)


def test_source_vector_per_contract() -> None:
    rng = np.random.default_rng()
    e = rng.normal(0, 3, (1, 512)).astype(np.float32)
    emap = rng.normal(0, 1, (512, 512)).astype(np.float32)
    n = source_vector(e, "normalized", None)
    np.testing.assert_allclose(np.linalg.norm(n), 1.0, rtol=1e-6)
    np.testing.assert_allclose(n, e / np.linalg.norm(e), rtol=1e-5)
    lat = source_vector(e, "emap", emap)
    ref = (e / np.linalg.norm(e)) @ emap
    np.testing.assert_allclose(lat, ref / np.linalg.norm(ref), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(source_vector(e, "raw", None), e)


def test_emap_is_the_last_initializer() -> None:
    model = tm.inswapper(width=8, blocks=1, seed=5)
    emap = emap_of(model)
    assert emap.shape == (512, 512)
    from onnx import numpy_helper

    np.testing.assert_array_equal(emap, numpy_helper.to_array(model.graph.initializer[-1]))


def test_torch_runner_on_cpu_matches_onnxruntime() -> None:
    pytest.importorskip("torch")
    from swapstream.engines.torch_runner import TorchRunner

    model = tm.inswapper(width=8, blocks=2, seed=1)
    rng = np.random.default_rng()
    with OnnxRuntimeRunner(model.SerializeToString(), providers="cpu") as ort, \
            TorchRunner(model, device="cpu") as tr:
        assert tr.architecture == "inswapper" and tr.precision == "fp32"
        for batch in (1, 3):
            feed = {"target": rng.uniform(0, 1, (batch, 3, 128, 128)).astype(np.float32),
                    "source": rng.normal(0, 0.05, (batch, 512)).astype(np.float32)}
            ref = ort.infer(feed)["output"]
            got = tr.infer(feed)["output"]
            # fp32 on both sides; only the summation order of the convolutions differs.
            err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            assert err < 1e-5


def test_runner_rejects_bad_feeds() -> None:
    model = tm.inswapper(width=8, blocks=1, seed=1)
    with OnnxRuntimeRunner(model.SerializeToString(), providers="cpu") as ort:
        with pytest.raises(ValueError, match="target"):
            ort.infer({"target": np.zeros((1, 3, 64, 64), np.float32),
                       "source": np.zeros((1, 512), np.float32)})
        with pytest.raises(ValueError, match="missing"):
            ort.infer({"target": np.zeros((1, 3, 128, 128), np.float32)})
        with pytest.raises(ValueError, match="float32"):
            ort.infer({"target": np.zeros((1, 3, 128, 128), np.float64),
                       "source": np.zeros((1, 512), np.float32)})


@pytest.mark.parametrize("size", [128, 256])
def test_identity_swapper_round_trip(size: int) -> None:
    """Crop, identity model, paste-back: the face region must come back (PSNR >= 35 dB)."""
    from swapstream.demo import grace_hopper

    img = grace_hopper()
    analyser = FaceAnalyser(load_config())
    # Scale the portrait so that the crop samples the face about 3x as densely as the frame does.
    # Two bilinear resamplings (frame -> crop -> frame) act as a low-pass filter on Grace Hopper's
    # fine skin texture whatever the implementation: the same double warp done with cv2.warpAffine
    # measures 31 dB at 1:1, 34 dB at 2x and 36 dB at ~3x. What this test checks is the geometry,
    # normalisation and paste-back, so it runs where resampling alone stays above 35 dB, and also
    # requires that we lose nothing beyond what the cv2 double warp loses.
    face0 = analyser.analyse_image(img)[0]
    eye = float(np.linalg.norm(face0.kps[1] - face0.kps[0]))
    k = 0.35 * (ARCFACE_128[1, 0] - ARCFACE_128[0, 0]) * size / eye
    img = cv2.resize(img, None, fx=k, fy=k, interpolation=cv2.INTER_AREA)
    face = analyser.analyse_image(img)[0]
    analyser.close()
    mean, std = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)) if size == 128 else ((0.5,) * 3, (0.5,) * 3)
    contract = SwapContract(size=size, template=ARCFACE_128, mean=mean, std=std,
                            embedding="normalized",
                            output_range="0_1_clip" if size == 128 else "std_mean")
    swapper_model = tm.identity_swapper(size=size, mean=mean, std=std)
    # The identity model ignores the source, and undoes the input normalisation itself.
    with OnnxRuntimeRunner(swapper_model.SerializeToString(), providers="cpu") as sw_runner, \
            OnnxRuntimeRunner(tm.arcface_stub(seed=0).SerializeToString(), providers="cpu") as emb:
        if contract.output_range == "std_mean":
            # The identity model returns target*std+mean in [0,1]; a std_mean contract would apply
            # it again, so describe its output honestly as [0, 1].
            contract = SwapContract(size=size, template=ARCFACE_128, mean=mean, std=std,
                                    embedding="normalized", output_range="0_1_clip")
        sw = NeuralSwapper(contract, sw_runner, Embedder(emb, ARCFACE_112_V2))
        sw.set_source(img, face)
        out = img.copy()
        assert sw.swap(out, [face]) == 1
        # The warm-up (file jobs and the runtime, before their first frame) calls the model at every
        # batch size up to the one asked for, twice each: a graph is captured, then replayed.
        infer, batches = sw_runner.infer, []

        def counting(feed: dict[str, np.ndarray], *args: object) -> object:
            batches.append(int(feed[contract.target_name].shape[0]))
            return infer(feed, *args)

        sw_runner.infer = counting  # type: ignore[method-assign]
        sw.warm_up(img.copy(), face, sw.identity(img, face), 3)
        sw_runner.infer = infer  # type: ignore[method-assign]
        assert batches == [1, 1, 2, 2, 3, 3], batches
    x1, y1, x2, y2 = face.box.astype(int)
    region = (slice(max(y1, 0), y2), slice(max(x1, 0), x2))
    value = psnr(out[region], img[region])
    assert value >= 35.0, f"identity round trip PSNR {value:.1f} dB"
    m = align_matrix(face.kps, ARCFACE_128, size)
    crop = cv2.warpAffine(img.astype(np.float32), m, (size, size), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REPLICATE)
    back = cv2.warpAffine(crop, m, (img.shape[1], img.shape[0]),
                          flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
    assert value >= psnr(np.clip(np.rint(back[region]), 0, 255), img[region]) - 0.5
    # Outside the pasted box nothing changed at all.
    diff = np.abs(out.astype(int) - img.astype(int)).max(axis=2)
    ys, xs = np.nonzero(diff)
    assert xs.min() >= x1 - 0.5 * (x2 - x1) and xs.max() <= x2 + 0.5 * (x2 - x1)
