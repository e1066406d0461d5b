"""The ONNX stand-ins of tools/make_test_models.py, run through ONNX Runtime on the CPU.

They stand in for downloaded zoo models in the runner and swapper tests, so their interfaces must be
exactly the real ones: names, shapes, dtypes, symbolic batch dimensions, initializer names and order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")





from ..zoo_models import make_test_models as mtm  # noqa: E402

WIDTH, BLOCKS = 8, 2
"""Small enough that a batch-4 run takes about 20 ms on one core."""


def session(model: "onnx.ModelProto") -> "ort.InferenceSession":
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # `emap` is unused by design; ORT warns that it drops it
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def io_spec(sess: "ort.InferenceSession") -> tuple[list[tuple], list[tuple]]:
    return ([(i.name, list(i.shape), i.type) for i in sess.get_inputs()],
            [(o.name, list(o.shape), o.type) for o in sess.get_outputs()])


def unit_sources(n: int, seed: int) -> np.ndarray:
    s = np.random.default_rng(seed).standard_normal((n, 512)).astype(np.float32)
    return s / np.linalg.norm(s, axis=1, keepdims=True)


def crops(n: int, size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 3, size, size), dtype=np.float32)


@pytest.fixture(scope="module")
def small_inswapper() -> "onnx.ModelProto":
    return mtm.inswapper(width=WIDTH, blocks=BLOCKS, seed=0)


# -- inswapper ---------------------------------------------------------------------------------------

def test_inswapper_interface(small_inswapper: "onnx.ModelProto") -> None:
    sess = session(small_inswapper)
    assert io_spec(sess) == (
        [("target", ["batch", 3, 128, 128], "tensor(float)"), ("source", ["batch", 512], "tensor(float)")],
        [("output", ["batch", 3, 128, 128], "tensor(float)")])
    assert small_inswapper.opset_import[0].version == 17


def test_inswapper_initializers_are_named_like_the_real_file(small_inswapper: "onnx.ModelProto") -> None:
    inits = {t.name: t for t in small_inswapper.graph.initializer}
    last = small_inswapper.graph.initializer[-1]
    assert last.name == "emap" and list(last.dims) == [512, 512]
    assert last.data_type == onnx.TensorProto.FLOAT
    assert {n for n in inits if n != "emap" and not n.startswith("/const/")} == (
        {"onnx::Add_164"}
        | {n for c in mtm.inswapper_convs(WIDTH, BLOCKS) for n in (c.weight, c.bias)}
        | {n for w, b, _, _ in mtm.inswapper_linears(WIDTH, BLOCKS) for n in (w, b)})
    for name in ("onnx::Conv_833", "onnx::Conv_836", "onnx::Conv_839", "onnx::Conv_842",
                 "onnx::Conv_845", "onnx::Conv_848", "onnx::Conv_851", "up0.1.weight"):
        assert name in inits
    w = WIDTH
    assert list(inits["onnx::Conv_833"].dims) == [w, 3, 7, 7]
    assert list(inits["onnx::Conv_842"].dims) == [8 * w, 4 * w, 3, 3]
    assert list(inits["styles.1.conv2.1.weight"].dims) == [8 * w, 8 * w, 3, 3]
    # Gemm with transB=1: (out, in), out = gamma (first half) then beta.
    assert list(inits["styles.0.style1.linear.weight"].dims) == [16 * w, 512]
    assert list(inits["styles.0.style1.linear.bias"].dims) == [16 * w]
    assert list(inits["onnx::Conv_851"].dims) == [w, 2 * w, 3, 3]
    assert list(inits["up0.1.weight"].dims) == [3, w, 7, 7]
    gemms = [n for n in small_inswapper.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 2 * BLOCKS
    assert all(a.name != "transB" or a.i == 1 for n in gemms for a in n.attribute)
    used = {i for n in small_inswapper.graph.node for i in n.input}
    assert "emap" not in used


def test_inswapper_batches_equal_single_runs(small_inswapper: "onnx.ModelProto") -> None:
    sess = session(small_inswapper)
    target, source = crops(4, 128, 1), unit_sources(4, 2)
    singles = [sess.run(None, {"target": target[i:i + 1], "source": source[i:i + 1]})[0] for i in range(4)]
    for n in range(1, 5):
        out = sess.run(None, {"target": target[:n], "source": source[:n]})[0]
        assert out.shape == (n, 3, 128, 128) and out.dtype == np.float32
        np.testing.assert_allclose(out, np.concatenate(singles[:n]), atol=1e-5, rtol=0)
    out = np.concatenate(singles)
    assert 0.0 < out.min() and out.max() < 1.0
    # The output depends on the source identity, not only on the target.
    swapped = sess.run(None, {"target": target[:1], "source": source[1:2]})[0]
    assert np.abs(swapped - singles[0]).max() > 1e-3


def test_inswapper_is_deterministic_per_seed(small_inswapper: "onnx.ModelProto") -> None:
    again = mtm.inswapper(width=WIDTH, blocks=BLOCKS, seed=0)
    other = mtm.inswapper(width=WIDTH, blocks=BLOCKS, seed=1)
    assert again.SerializeToString() == small_inswapper.SerializeToString()
    assert other.graph.initializer[1].raw_data == small_inswapper.graph.initializer[1].raw_data  # pads
    w0 = {t.name: t.raw_data for t in small_inswapper.graph.initializer}
    w1 = {t.name: t.raw_data for t in other.graph.initializer}
    assert w0["onnx::Conv_833"] != w1["onnx::Conv_833"] and w0["emap"] != w1["emap"]


def test_inswapper_parameter_count_and_cost(small_inswapper: "onnx.ModelProto") -> None:
    # The counting functions agree with the built graph at small size...
    assert mtm.model_param_count(small_inswapper) == mtm.inswapper_param_count(WIDTH, BLOCKS)
    # ...and the full size (not built here: 4.5 s and 2.8 GB) matches docs/neural.md.
    full = mtm.inswapper_param_count(128, 6)
    print(f"full inswapper_128: {full:,} parameters, {mtm.inswapper_macs() / 1e9:.2f} GMAC per face")
    assert abs(full - 138.3e6) < 0.5e6
    assert full == 138_292_739
    assert abs(mtm.inswapper_macs(128, 6) / 1e9 - 174.7) < 0.3


def test_inswapper_fp16_keeps_float32_io(small_inswapper: "onnx.ModelProto") -> None:
    half = mtm.inswapper(width=WIDTH, blocks=BLOCKS, seed=0, dtype="float16")
    kinds = {t.name: t.data_type for t in half.graph.initializer}
    assert kinds["onnx::Conv_833"] == onnx.TensorProto.FLOAT16
    assert kinds["styles.0.style1.linear.weight"] == onnx.TensorProto.FLOAT16
    assert half.graph.initializer[-1].name == "emap"
    sess = session(half)
    assert io_spec(sess) == io_spec(session(small_inswapper))
    target, source = crops(2, 128, 3), unit_sources(2, 4)
    out16 = sess.run(None, {"target": target, "source": source})[0]
    out32 = session(small_inswapper).run(None, {"target": target, "source": source})[0]
    assert out16.dtype == np.float32
    np.testing.assert_allclose(out16, out32, atol=2e-2)  # fp16 weights and activations: ~3 digits


def test_inswapper_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dtype"):
        mtm.inswapper(width=8, blocks=1, dtype="bfloat16")


# -- swapper contracts -----------------------------------------------------------------------------

@pytest.mark.parametrize("size, mean, std", [
    (128, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    (256, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    (256, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
])
def test_identity_swapper_gives_back_the_crop(size: int, mean: tuple, std: tuple) -> None:
    sess = session(mtm.identity_swapper(size, mean, std))
    assert io_spec(sess) == (
        [("target", ["batch", 3, size, size], "tensor(float)"), ("source", ["batch", 512], "tensor(float)")],
        [("output", ["batch", 3, size, size], "tensor(float)")])
    rgb = crops(3, size, 5)
    m = np.asarray(mean, np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, 3, 1, 1)
    out = sess.run(None, {"target": (rgb - m) / s, "source": unit_sources(3, 6) * 30})[0]
    np.testing.assert_allclose(out, rgb, atol=1e-6, rtol=0)


def test_identity_swapper_names_and_normalised_output() -> None:
    model = mtm.identity_swapper(256, (0.5,) * 3, (0.5,) * 3, name_in=("t", "s"), out="y",
                                 output_space="normalised")
    sess = session(model)
    assert [i.name for i in sess.get_inputs()] == ["t", "s"]
    assert [o.name for o in sess.get_outputs()] == ["y"]
    target = crops(2, 256, 7) * 2 - 1
    out = sess.run(None, {"t": target, "s": unit_sources(2, 8)})[0]
    np.testing.assert_array_equal(out, target)


def test_simswap_standin_contract() -> None:
    sess = session(mtm.simswap_256(seed=0))
    assert io_spec(sess) == (
        [("target", ["batch", 3, 256, 256], "tensor(float)"), ("source", ["batch", 512], "tensor(float)")],
        [("output", ["batch", 3, 256, 256], "tensor(float)")])
    rgb = crops(2, 256, 9)
    m = np.asarray(mtm.IMAGENET_MEAN, np.float32).reshape(1, 3, 1, 1)
    s = np.asarray(mtm.IMAGENET_STD, np.float32).reshape(1, 3, 1, 1)
    src = unit_sources(2, 10)
    out = sess.run(None, {"target": (rgb - m) / s, "source": src})[0]
    assert np.abs(out - rgb).max() <= 0.1 + 1e-6
    assert np.abs(out - rgb).max() > 1e-3
    other = sess.run(None, {"target": (rgb - m) / s, "source": src[::-1].copy()})[0]
    assert np.abs(other - out).max() > 1e-4
    exact = session(mtm.simswap_256(perturbation=0.0)).run(None, {"target": (rgb - m) / s, "source": src})[0]
    np.testing.assert_allclose(exact, rgb, atol=1e-6, rtol=0)


def test_hyperswap_standin_contract() -> None:
    sess = session(mtm.hyperswap_1a_256(seed=0))
    assert io_spec(sess) == (
        [("target", ["batch", 3, 256, 256], "tensor(float)"), ("source", ["batch", 512], "tensor(float)")],
        [("output", ["batch", 3, 256, 256], "tensor(float)")])
    rgb = crops(2, 256, 11)
    out = sess.run(None, {"target": (rgb - 0.5) / 0.5, "source": unit_sources(2, 12)})[0]
    assert out.min() >= -1.0 and out.max() <= 1.0
    assert np.abs(out * 0.5 + 0.5 - rgb).max() <= 0.05 + 1e-6


def test_arcface_stub_contract() -> None:
    model = mtm.arcface_stub(seed=0)
    sess = session(model)
    assert io_spec(sess) == ([("input", ["batch", 3, 112, 112], "tensor(float)")],
                             [("output", ["batch", 512], "tensor(float)")])
    faces = crops(3, 112, 13) * 2 - 1
    out = sess.run(None, {"input": faces})[0]
    assert out.shape == (3, 512) and out.dtype == np.float32
    single = sess.run(None, {"input": faces[1:2]})[0]
    np.testing.assert_allclose(out[1:2], single, atol=1e-5, rtol=0)
    assert np.abs(out[0] - out[1]).max() > 1e-3
    insightface_names = session(mtm.arcface_stub(seed=0, input_name="input.1", output_name="683"))
    assert [i.name for i in insightface_names.get_inputs()] == ["input.1"]
    assert [o.name for o in insightface_names.get_outputs()] == ["683"]


# -- detectors (decoding is tested in tests/stream/test_neural_detect.py) ----------------------------

def test_scrfd_synthetic_interface() -> None:
    sess = session(mtm.scrfd_synthetic(640))
    inputs, outputs = io_spec(sess)
    assert inputs == [("input", [1, 3, 640, 640], "tensor(float)")]
    n = {8: 12800, 16: 3200, 32: 800}
    assert outputs == ([(f"score_{s}", [n[s], 1], "tensor(float)") for s in (8, 16, 32)]
                       + [(f"bbox_{s}", [n[s], 4], "tensor(float)") for s in (8, 16, 32)]
                       + [(f"kps_{s}", [n[s], 10], "tensor(float)") for s in (8, 16, 32)])
    with pytest.raises(ValueError, match="shape"):
        mtm.scrfd_synthetic(640, mtm.plant_scrfd(320, []))


def test_yoloface_synthetic_interface() -> None:
    sess = session(mtm.yoloface_synthetic(640))
    assert io_spec(sess) == ([("input", [1, 3, 640, 640], "tensor(float)")],
                             [("output0", [1, 20, 8400], "tensor(float)")])
    out = sess.run(None, {"input": np.zeros((1, 3, 640, 640), np.float32)})[0]
    assert out.shape == (1, 20, 8400) and not out.any()


def test_script_writes_every_model(tmp_path: Path) -> None:
    mtm.main([str(tmp_path)])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(mtm.build_all().keys())
    assert "inswapper_128_synthetic.onnx" not in names  # the 550 MB one only with --full-inswapper
    for p in tmp_path.iterdir():
        onnx.checker.check_model(str(p))
