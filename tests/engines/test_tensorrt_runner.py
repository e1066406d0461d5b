"""The TensorRT runner: what runs everywhere (engine cache keys, the fp16 ONNX conversion checked with
ONNX Runtime, behaviour without TensorRT, the CLI's one-line error, the start-up self-check's
comparison and `auto`'s fall-back) and, where `import tensorrt` works and a GPU is present, engines
compared with ONNX Runtime at batch 1-4 and the self-check passing.

TensorRT cannot be installed on our CI or on the H200 device machine (NVIDIA's wheels download from an
index those machines cannot reach), so the TensorRT group is skipped there.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from swapstream.engines.errors import EngineUserError
from swapstream.engines.runner import FeedError
from swapstream.engines.tensorrt_runner import (SELF_CHECK_REL_TOL, EngineCacheKey, as_device_array,
                                                convert_onnx_to_fp16, default_engine_cache_dir,
                                                engine_cache_path, make_engine_cache_key,
                                                norm_statistics_nodes, outputs_agree, self_check_case,
                                                tensorrt_available, tensorrt_self_check,
                                                timing_cache_path)

REPO = Path(__file__).resolve().parents[2]
EPS = 1e-8
"""Inswapper's instance-norm eps (docs/neural.md): below fp16's smallest subnormal, so it rounds to 0
in fp16."""

# fp16 carries 11 significant bits (~5e-4 relative per rounding); a few layers of convolutions and two
# norms accumulate a few of those, so the output's relative L2 error stays well under 1e-2 (measured:
# ~5e-4). A broken conversion (a norm in fp16 with eps 0, a weight cast wrongly) is off by far more.
FP16_REL_TOL = 1e-2


def tiny_model(seed: int = 0, channels: int = 8, size: int = 16) -> onnx.ModelProto:
    """Reflect-pad + Conv, InstanceNormalization (eps 1e-8, no affine), LeakyReLU, a ReduceMean-based
    AdaIN-style norm (eps 1e-8) with gamma/beta, Conv 1x1, Tanh: the inswapper's ingredients, with a
    dynamic batch dimension N."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    c = channels
    inits = [
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(w(c, 3, 3, 3), "w1"), numpy_helper.from_array(w(c), "b1"),
        numpy_helper.from_array(np.ones(c, np.float32), "in_scale"),
        numpy_helper.from_array(np.zeros(c, np.float32), "in_bias"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
        numpy_helper.from_array(1 + w(1, c, 1, 1), "gamma"), numpy_helper.from_array(w(1, c, 1, 1), "beta"),
        numpy_helper.from_array(w(3, c, 1, 1), "w2"), numpy_helper.from_array(w(3), "b2"),
    ]
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]),
        helper.make_node("InstanceNormalization", ["c1", "in_scale", "in_bias"], ["n1"], epsilon=EPS),
        helper.make_node("LeakyRelu", ["n1"], ["a1"], alpha=0.2),
        helper.make_node("ReduceMean", ["a1", "axes"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["a1", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"]),
        helper.make_node("Add", ["scaled", "beta"], ["shifted"]),
        helper.make_node("Conv", ["shifted", "w2", "b2"], ["c2"]),
        helper.make_node("Tanh", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_norm_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, size, size])], initializer=inits)
    # Opset 18 (ReduceMean takes axes as an input) and IR 8, which ONNX Runtime 1.31 and TensorRT read.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def ort_run(model: bytes, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return tiny_model()


@pytest.fixture
def onnx_file(tmp_path: Path, model: onnx.ModelProto) -> Path:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(model.SerializeToString())
    return path


# ------------------------------------------------------------------------------------ cache keys

KEY_ARGS = dict(gpu_name="NVIDIA H200", compute_capability="9.0", trt_version="10.8.0.43",
                precision="fp16", max_batch=4)


def test_cache_path_is_stable(onnx_file: Path, tmp_path: Path) -> None:
    a = engine_cache_path(tmp_path, onnx_file, **KEY_ARGS)
    b = engine_cache_path(tmp_path, onnx_file, **KEY_ARGS)
    assert a == b
    assert a.parent == tmp_path and a.suffix == ".engine"
    # Readable: a person listing the cache can tell the engines apart.
    for part in ("tiny", "fp16", "b1-4-4", "nvidia-h200", "sm90", "trt10.8.0.43"):
        assert part in a.name
    # The same model bytes under another file name share the key (the hash is of the content).
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(onnx_file.read_bytes())
    assert make_engine_cache_key(copy, **KEY_ARGS) == make_engine_cache_key(onnx_file, **KEY_ARGS)


@pytest.mark.parametrize("field, value", [
    ("gpu_name", "NVIDIA A100-SXM4-80GB"),
    ("compute_capability", "8.0"),
    ("trt_version", "11.0.0.8"),
    ("trt_version", "10.8.0.44"),  # even a build-number change: plans do not cross versions
    ("precision", "fp32"),
    ("max_batch", 8),
])
def test_cache_path_changes_with_each_field(onnx_file: Path, tmp_path: Path, field: str,
                                            value: object) -> None:
    base = engine_cache_path(tmp_path, onnx_file, **KEY_ARGS)
    assert engine_cache_path(tmp_path, onnx_file, **{**KEY_ARGS, field: value}) != base


def test_cache_path_changes_with_model_bytes_and_batch_range(onnx_file: Path, tmp_path: Path) -> None:
    base = engine_cache_path(tmp_path, onnx_file, **KEY_ARGS)
    assert engine_cache_path(tmp_path, onnx_file, **KEY_ARGS, min_batch=2) != base
    assert engine_cache_path(tmp_path, onnx_file, **KEY_ARGS, opt_batch=2) != base
    onnx_file.write_bytes(tiny_model(seed=1).SerializeToString())  # same name, new weights
    assert engine_cache_path(tmp_path, onnx_file, **KEY_ARGS) != base


def test_cache_key_digest_covers_every_field() -> None:
    key = EngineCacheKey("ab" * 32, "NVIDIA H200", "9.0", "10.8.0.43", "fp16", 1, 4, 4)
    for field, value in [("model_sha256", "cd" * 32), ("recipe", key.recipe + 1), ("min_batch", 2)]:
        other = EngineCacheKey(**{**key.__dict__, field: value})
        assert other.digest() != key.digest()
        assert other.filename("m") != key.filename("m")


def test_compute_capability_spellings_agree(onnx_file: Path) -> None:
    keys = {make_engine_cache_key(onnx_file, **{**KEY_ARGS, "compute_capability": cc})
            for cc in ("9.0", (9, 0), "90")}
    assert len(keys) == 1
    with pytest.raises(ValueError):
        make_engine_cache_key(onnx_file, **{**KEY_ARGS, "compute_capability": "hopper"})


def test_bad_batch_range_is_a_user_error(onnx_file: Path) -> None:
    with pytest.raises(EngineUserError, match="min <= opt <= max"):
        make_engine_cache_key(onnx_file, **KEY_ARGS, min_batch=3, opt_batch=2)


def test_timing_cache_is_per_gpu_and_version(tmp_path: Path) -> None:
    a = timing_cache_path(tmp_path, "NVIDIA H200", "9.0", "10.8.0.43")
    assert a == timing_cache_path(tmp_path, "NVIDIA H200", (9, 0), "10.8.0.43")
    assert a != timing_cache_path(tmp_path, "NVIDIA H200", "9.0", "11.0.0.8")
    assert a != timing_cache_path(tmp_path, "NVIDIA A100", "8.0", "10.8.0.43")


def test_engine_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SWAPSTREAM_ENGINE_CACHE", str(tmp_path / "engines"))
    assert default_engine_cache_dir() == tmp_path / "engines"
    monkeypatch.delenv("SWAPSTREAM_ENGINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_engine_cache_dir() == tmp_path / "xdg" / "swapstream" / "engines"


# ------------------------------------------------------------------------- fp16 ONNX conversion

def test_norm_statistics_nodes(model: onnx.ModelProto) -> None:
    kept = [model.graph.node[i].output[0] for i in sorted(norm_statistics_nodes(model.graph))]
    # The instance norm, and the ReduceMean norm from its mean up to the division; not the affine
    # Mul/Add after it, nor the convolutions.
    assert kept == ["n1", "mean", "d", "d2", "var", "var_eps", "std", "normed"]


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
def test_fp16_conversion_matches_fp32(model: onnx.ModelProto, batch: int) -> None:
    fp16 = convert_onnx_to_fp16(model.SerializeToString())
    x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    ref = ort_run(model.SerializeToString(), x)
    got = ort_run(fp16, x)
    assert got.dtype == np.float32  # I/O stays float32: callers feed the same arrays as before
    assert rel_err(got, ref) < FP16_REL_TOL
    # Element-wise too: tanh output in [-1, 1], so an absolute bound is meaningful (fp16 ulp at 1 is 1e-3).
    assert float(np.abs(got - ref).max()) < 1e-2


def test_fp16_conversion_structure(model: onnx.ModelProto) -> None:
    m = onnx.load_from_string(convert_onnx_to_fp16(model.SerializeToString()))
    inits = {t.name: t for t in m.graph.initializer}
    for name in ("w1", "b1", "gamma", "beta", "w2", "b2"):
        assert inits[name].data_type == TensorProto.FLOAT16, name
    # Consumed only by fp32 norm nodes: kept in float32, so eps keeps its exact value.
    for name in ("in_scale", "in_bias", "eps"):
        assert inits[name].data_type == TensorProto.FLOAT, name
    assert numpy_helper.to_array(inits["eps"]) == np.float32(EPS)
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert m.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    # The norms read float32: each of their activation inputs comes from a Cast to float.
    producers = {o: n for n in m.graph.node for o in n.output}
    for node in m.graph.node:
        if node.op_type in ("InstanceNormalization", "ReduceMean") and node.input[0] in producers:
            src = producers[node.input[0]]
            if src.op_type == "Cast":
                assert helper.get_attribute_value(src.attribute[0]) == TensorProto.FLOAT
    inorm = next(n for n in m.graph.node if n.op_type == "InstanceNormalization")
    assert producers[inorm.input[0]].op_type == "Cast"
    first_rm = next(n for n in m.graph.node if n.op_type == "ReduceMean")
    assert producers[first_rm.input[0]].op_type == "Cast"


def test_fp16_conversion_keeps_flat_channels_finite(model: onnx.ModelProto) -> None:
    """A flat input makes every channel's variance 0. In fp32 the eps gives 0/1e-4 = 0; with the norm in
    fp16 the eps rounds to 0 and the division is 0/0. This is why the statistics stay in fp32."""
    x = np.full((2, 3, 16, 16), 0.5, np.float32)
    ref = ort_run(model.SerializeToString(), x)
    got = ort_run(convert_onnx_to_fp16(model.SerializeToString()), x)
    assert np.isfinite(got).all()
    assert float(np.abs(got - ref).max()) < 1e-2
    naive = ort_run(convert_onnx_to_fp16(model.SerializeToString(), keep_norm_fp32=False), x)
    assert np.isnan(naive).any()


def test_fp16_conversion_with_fp16_io(model: onnx.ModelProto) -> None:
    m = onnx.load_from_string(convert_onnx_to_fp16(model.SerializeToString(), keep_io_types=False))
    assert m.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert m.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    x = np.random.default_rng(7).standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = ort_run(m.SerializeToString(), x.astype(np.float16))
    assert got.dtype == np.float16
    assert rel_err(got, ort_run(model.SerializeToString(), x)) < FP16_REL_TOL


def test_fp16_conversion_of_constants_casts_and_resize() -> None:
    """Constant/ConstantOfShape/Cast-to-float producers, Resize (whose scales stay float32), an output
    that is also consumed inside the graph, and a Shape output that is not float at all."""
    inits = [numpy_helper.from_array(np.array([], np.float32), "roi"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             numpy_helper.from_array(np.array([1, 1, 1, 1], np.int64), "ones_shape"),
             numpy_helper.from_array(np.array([3], np.int64), "three")]
    nodes = [helper.make_node("Constant", [], ["half"], value_float=0.5),
             helper.make_node("Mul", ["x", "half"], ["xh"]),
             helper.make_node("Resize", ["xh", "roi", "scales"], ["up"], mode="linear"),
             helper.make_node("Cast", ["three"], ["three_f"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["up", "three_f"], ["up3"]),
             helper.make_node("ConstantOfShape", ["ones_shape"], ["zero"]),
             helper.make_node("Add", ["up3", "zero"], ["out1"]),
             helper.make_node("Relu", ["out1"], ["out2"]),
             helper.make_node("Shape", ["out2"], ["shape"])]
    outs = [helper.make_tensor_value_info("out1", TensorProto.FLOAT, [1, 2, 8, 8]),
            helper.make_tensor_value_info("out2", TensorProto.FLOAT, [1, 2, 8, 8]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [4])]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    graph = helper.make_graph(nodes, "misc", [x_info], outs, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fp16 = convert_onnx_to_fp16(m.SerializeToString())
    conv = {t.name: t.data_type for t in onnx.load_from_string(fp16).graph.initializer}
    assert conv["scales"] == TensorProto.FLOAT
    x = np.random.default_rng(3).random((1, 2, 4, 4)).astype(np.float32)
    import onnxruntime as ort

    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = ort.InferenceSession(fp16, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for r, g in zip(ref, got):
        assert g.dtype == r.dtype
        # values in [3, 3.5]: fp16 spacing there is 2**-9 ~ 2e-3, so half of that bounds the rounding.
        np.testing.assert_allclose(g, r, atol=1e-3, rtol=0)


def test_fp16_conversion_rejects_control_flow() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "cf", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ValueError, match="control-flow"):
        convert_onnx_to_fp16(m.SerializeToString())


# -------------------------------------------------------------------------- without TensorRT

def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # wide: Rich must not wrap the one line we check
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


BLOCK_TRT = "import sys; sys.modules['tensorrt'] = None\n"
"""Makes `import tensorrt` fail in a child process, whether or not TensorRT is installed there."""


def test_module_imports_without_tensorrt_or_cupy() -> None:
    r = _python("import sys\n"
                "import swapstream.engines.tensorrt_runner as m\n"
                "assert 'tensorrt' not in sys.modules and 'cupy' not in sys.modules, 'imported eagerly'\n"
                "sys.modules['tensorrt'] = None\n"
                "ok, why = m.tensorrt_available()\n"
                "print(ok, why)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False TensorRT is not installed:")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_tensorrt_available_says_why_not_here() -> None:
    ok, why = tensorrt_available()
    assert ok is False
    assert why.startswith("TensorRT is not installed:")
    assert "\n" not in why


def test_runner_without_tensorrt_is_a_user_error(onnx_file: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from swapstream.engines.tensorrt_runner import TensorRTRunner

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    runner = TensorRTRunner(onnx_file, cache_dir=tmp_path)
    with pytest.raises(EngineUserError, match="^TensorRT is not installed"):
        with runner:
            pass
    assert not list(tmp_path.glob("*.engine"))


def test_host_arrays_are_refused_with_a_fix() -> None:
    with pytest.raises(FeedError, match=r"'target' is a numpy array in host memory.*cupy\.asarray"):
        as_device_array("target", np.zeros((1, 3, 8, 8), np.float32), cupy=None)


def _assert_one_line_error(r: subprocess.CompletedProcess[str], start: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(start), lines[0]
    assert "Traceback" not in r.stderr


def test_engines_build_cli_without_tensorrt(onnx_file: Path, tmp_path: Path) -> None:
    r = _python(BLOCK_TRT + "from swapstream.engines_cli import main\n"
                "sys.argv = ['swapstream-engines'] + sys.argv[1:]\nmain()\n",
                "build", str(onnx_file), "--cache-dir", str(tmp_path / "cache"))
    _assert_one_line_error(r, "error: TensorRT is not installed:")
    assert not (tmp_path / "cache").exists()


def test_engines_build_cli_mounted_in_the_main_cli(onnx_file: Path) -> None:
    """Mounted under `swapstream` (as the main CLI will), the main entry point prints the same line."""
    r = _python(BLOCK_TRT + "from swapstream.cli import app, main\n"
                "from swapstream.engines_cli import app as engines\n"
                "app.add_typer(engines)\n"
                "sys.argv = ['swapstream'] + sys.argv[1:]\nmain()\n",
                "engines", "build", str(onnx_file))
    _assert_one_line_error(r, "error: TensorRT is not installed:")


def test_build_engines_tool_without_tensorrt(onnx_file: Path) -> None:
    r = _python(BLOCK_TRT + "import runpy\n"
                "sys.argv = ['build_engines.py'] + sys.argv[1:]\n"
                "runpy.run_path('tools/build_engines.py', run_name='__main__')\n",
                str(onnx_file), "--precision", "fp32")
    _assert_one_line_error(r, "error: TensorRT is not installed:")


# ------------------------------------------------------------------- with TensorRT and a GPU

needs_trt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None,
                               reason="TensorRT is not installed (it cannot be on our CI or device machines)")


@pytest.fixture
def trt_ready() -> None:
    ok, why = tensorrt_available()
    if not ok:
        pytest.skip(why)


# TF32 is on by default in TensorRT's fp32 builds: its 10-bit mantissa gives ~1e-3 relative error.
TRT_TOL = {"fp32": 5e-3, "fp16": FP16_REL_TOL}


@needs_trt
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("graphs", [True, False])
def test_tensorrt_matches_onnxruntime(trt_ready: None, onnx_file: Path, tmp_path: Path, cp: object,
                                      precision: str, graphs: bool) -> None:
    import cupy

    from swapstream.engines.tensorrt_runner import TensorRTRunner

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    runner = TensorRTRunner(onnx_file, cache_dir=tmp_path, precision=precision, max_batch=4,
                            use_cuda_graphs=graphs)
    with runner:
        assert runner.batch_range == (1, 4)
        assert [s.name for s in runner.inputs] == ["x"] and runner.inputs[0].dtype == np.float32
        # Every size, then sizes again out of order: replays must not mix up buffers or shapes.
        for batch in (1, 2, 3, 4, 4, 1, 3, 2):
            x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
            out = runner.infer({"x": cupy.asarray(x)}, stream=stream)
            stream.synchronize()
            got = cupy.asnumpy(out["y"])
            assert got.shape == (batch, 3, 16, 16)
            assert rel_err(got, ort_run(onnx_file.read_bytes(), x)) < TRT_TOL[precision], batch
        if graphs:
            assert runner.graph_captures + runner.graph_failures == 4
    with TensorRTRunner(onnx_file, cache_dir=tmp_path, precision=precision) as again:
        assert again.engine_built is False  # loaded from the cache


@needs_trt
@pytest.mark.gpu
@pytest.mark.slow
def test_tensorrt_fp16_flat_input_stays_finite(trt_ready: None, onnx_file: Path, tmp_path: Path,
                                               cp: object) -> None:
    import cupy

    from swapstream.engines.tensorrt_runner import TensorRTRunner

    x = np.full((2, 3, 16, 16), 0.5, np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with TensorRTRunner(onnx_file, cache_dir=tmp_path, precision="fp16") as runner:
        got = cupy.asnumpy(runner.infer({"x": cupy.asarray(x)}, stream=stream)["y"])
    assert np.isfinite(got).all()
    assert float(np.abs(got - ort_run(onnx_file.read_bytes(), x)).max()) < 1e-2


@needs_trt
@pytest.mark.gpu
@pytest.mark.slow
def test_tensorrt_streams_get_their_own_contexts(trt_ready: None, onnx_file: Path, tmp_path: Path,
                                                 cp: object) -> None:
    import cupy

    from swapstream.engines.tensorrt_runner import TensorRTRunner

    x = np.random.default_rng(5).standard_normal((3, 3, 16, 16)).astype(np.float32)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with TensorRTRunner(onnx_file, cache_dir=tmp_path, precision="fp32") as runner:
        a = runner.infer({"x": cupy.asarray(x)}, stream=s1)["y"]
        b = runner.infer({"x": cupy.asarray(x)}, stream=s2)["y"]
        s1.synchronize()
        s2.synchronize()
        assert a.data.ptr != b.data.ptr  # separate buffers per stream
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))
        with pytest.raises(FeedError, match="host memory"):
            runner.infer({"x": x}, stream=s1)
        with pytest.raises(FeedError, match="outside the engine's range"):
            runner.infer({"x": cupy.zeros((5, 3, 16, 16), np.float32)}, stream=s1)


# ------------------------------------------- the runner's CuPy side, driven by a stand-in TensorRT

class _FakeContext:
    """An IExecutionContext stand-in whose enqueue computes y = 2 * tanh(x) with CuPy kernels on the
    given stream, at the addresses and shapes the runner bound: enough to check the runner's buffers,
    copies, bindings and CUDA-graph capture and replay for real on a GPU without TensorRT."""

    def __init__(self, engine: "_FakeEngine") -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if not 1 <= shape[0] <= 4:
            return False
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes["x"]  # the output has the input's shape

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, handle: int) -> bool:
        import cupy

        self.engine.enqueues += 1
        shape = self.shapes["x"]
        n = int(np.prod(shape))

        def view(name: str) -> "cupy.ndarray":
            mem = cupy.cuda.UnownedMemory(self.addresses[name], n * 4, self)
            return cupy.ndarray(shape, np.float32, cupy.cuda.MemoryPointer(mem, 0))

        x, y = view("x"), view("y")
        with cupy.cuda.ExternalStream(handle):
            # In place, no temporaries: a pool allocation made while capturing would be freed (and
            # reused) before the graph replays.
            cupy.tanh(x, out=y)
            cupy.multiply(y, 2, out=y)
        return True


class _FakeEngine:
    num_io_tensors = 2

    def __init__(self) -> None:
        self.enqueues = 0
        self.contexts = 0

    def get_tensor_name(self, i: int) -> str:
        return ["x", "y"][i]

    def get_tensor_mode(self, name: str) -> str:
        return "input" if name == "x" else "output"

    def get_tensor_dtype(self, name: str) -> str:
        return "float32"

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 3, 16, 16)

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        return [(1, 3, 16, 16), (4, 3, 16, 16), (4, 3, 16, 16)]

    def create_execution_context(self) -> _FakeContext:
        self.contexts += 1
        return _FakeContext(self)


@pytest.fixture
def fake_trt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cp: object) -> _FakeEngine:
    """Installs a stand-in `tensorrt` module and engine cache, returning the engine."""
    import types

    from swapstream.engines import tensorrt_runner as tr

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("real TensorRT present: the tests above cover the runner")
    engine = _FakeEngine()
    fake = types.ModuleType("tensorrt")
    fake.__version__ = "10.99.0-fake"  # type: ignore[attr-defined]
    fake.nptype = np.dtype  # type: ignore[attr-defined]
    fake.TensorIOMode = types.SimpleNamespace(INPUT="input")  # type: ignore[attr-defined]

    class Runtime:
        def __init__(self, logger: object) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> _FakeEngine:
            return engine

    fake.Runtime = Runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    plan = tmp_path / "fake.engine"
    plan.write_bytes(b"plan")
    key = EngineCacheKey("0" * 64, "gpu", "9.0", "10.99.0-fake", "fp16", 1, 4, 4)
    monkeypatch.setattr(tr, "ensure_engine", lambda *a, **k: tr.EngineBuildResult(plan, False, 0.0, key))
    monkeypatch.setattr(tr, "_trt_logger", lambda: None)
    return engine


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_runner_buffers_and_graphs_with_a_stand_in_engine(fake_trt: _FakeEngine, onnx_file: Path,
                                                          tmp_path: Path, graphs: bool) -> None:
    import cupy

    from swapstream.engines.tensorrt_runner import TensorRTRunner

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    sizes = (1, 2, 3, 4, 4, 1, 3, 2, 2)
    with TensorRTRunner(onnx_file, cache_dir=tmp_path, use_cuda_graphs=graphs) as runner:
        assert runner.batch_range == (1, 4)
        assert runner.inputs[0].shape == ("batch", 3, 16, 16)
        for batch in sizes:
            x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
            y = runner.infer({"x": cupy.asarray(x)}, stream=stream)["y"]
            stream.synchronize()
            np.testing.assert_allclose(cupy.asnumpy(y), 2 * np.tanh(x), rtol=1e-6, atol=1e-6)
        if graphs:
            # One eager warm-up enqueue and one captured enqueue per batch size; every later call of a
            # size replayed its graph and enqueued nothing.
            assert runner.graph_captures == 4 and runner.graph_failures == 0
            assert fake_trt.enqueues == 2 * 4
        else:
            assert fake_trt.enqueues == len(sizes)
        assert fake_trt.contexts == 1


@pytest.mark.gpu
def test_runner_streams_and_feeds_with_a_stand_in_engine(fake_trt: _FakeEngine, onnx_file: Path,
                                                         tmp_path: Path) -> None:
    import cupy

    from swapstream.engines.tensorrt_runner import TensorRTRunner

    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with TensorRTRunner(onnx_file, cache_dir=tmp_path) as runner:
        a = runner.infer({"x": cupy.asarray(x)}, stream=s1)["y"]
        b = runner.infer({"x": cupy.asarray(x)}, stream=s2)["y"]
        s1.synchronize()
        s2.synchronize()
        assert fake_trt.contexts == 2  # one execution context per stream
        assert a.data.ptr != b.data.ptr
        np.testing.assert_array_equal(cupy.asnumpy(a), cupy.asnumpy(b))
        # Outputs are the fixed buffers: the next call of that size on that stream overwrites them.
        again = runner.infer({"x": cupy.asarray(-x)}, stream=s1)["y"]
        s1.synchronize()
        assert again.data.ptr == a.data.ptr
        np.testing.assert_allclose(cupy.asnumpy(a), -2 * np.tanh(x), rtol=1e-6, atol=1e-6)
        # A non-contiguous device feed is copied into the contiguous input buffer.
        wide = cupy.asarray(np.repeat(x, 2, axis=3))[..., ::2]
        out = runner.infer({"x": wide}, stream=s2)["y"]
        s2.synchronize()
        np.testing.assert_allclose(cupy.asnumpy(out), 2 * np.tanh(x), rtol=1e-6, atol=1e-6)
        # The legacy default stream cannot be captured: it runs eagerly, and still right.
        captures = runner.graph_captures
        out = runner.infer({"x": cupy.asarray(x)}, stream=cupy.cuda.Stream.null)["y"]
        cupy.cuda.Stream.null.synchronize()
        assert runner.graph_captures == captures
        np.testing.assert_allclose(cupy.asnumpy(out), 2 * np.tanh(x), rtol=1e-6, atol=1e-6)
        with pytest.raises(FeedError, match="host memory"):
            runner.infer({"x": x}, stream=s1)
        with pytest.raises(FeedError, match="outside the engine's range 1-4"):
            runner.infer({"x": cupy.zeros((5, 3, 16, 16), np.float32)}, stream=s1)


# ------------------------------------------------------------------------- start-up self-check


def test_outputs_agree_on_real_arrays() -> None:
    rng = np.random.default_rng(3)
    want = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert outputs_agree(want.copy(), want, rel_tol=0.0)[0]
    # fp16 rounding of every value (what an fp16 engine's output is at best): well inside fp16's
    # tolerance, outside a tolerance tighter than its 2^-11 relative step.
    halved = want.astype(np.float16).astype(np.float32)
    ok, why = outputs_agree(halved, want, rel_tol=SELF_CHECK_REL_TOL["fp16"])
    assert ok and why.startswith("relative error "), why
    assert not outputs_agree(halved, want, rel_tol=1e-6)[0]
    # Wrong results: another input's output, a sign flipped channel, garbage, NaN, another shape.
    assert not outputs_agree(rng.standard_normal(want.shape), want, rel_tol=0.5)[0]
    flipped = want.copy()
    flipped[:, 1] *= -1
    ok, why = outputs_agree(flipped, want, rel_tol=SELF_CHECK_REL_TOL["fp32"])
    assert not ok and "over the 0.005 allowed" in why, why
    nan = want.copy()
    nan[0, 0, 0, :3] = np.nan
    ok, why = outputs_agree(nan, want, rel_tol=1.0)
    assert not ok and why == f"3 of {want.size} output values are not finite", why
    ok, why = outputs_agree(want[:1], want, rel_tol=1.0)
    assert not ok and "(1, 3, 8, 8)" in why and "(2, 3, 8, 8)" in why, why
    # An all-zero reference: the output's own size is the error.
    zeros = np.zeros((4,), np.float32)
    assert outputs_agree(zeros, zeros, rel_tol=0.0)[0]
    assert not outputs_agree(np.full(4, 1e-2, np.float32), zeros, rel_tol=1e-3)[0]


def test_self_check_case_tells_a_right_model_from_a_wrong_one() -> None:
    """The check's reference, ONNX Runtime's output, accepts the same model run another way (its fp16
    conversion, as an fp16 engine would compute) and refuses a model with one weight changed."""
    data, x, want = self_check_case()
    assert want.shape == (1, 3, 32, 32) and np.isfinite(want).all() and float(want.std()) > 0.05
    again = self_check_case()
    assert again[0] == data and np.array_equal(again[1], x) and np.array_equal(again[2], want)
    half = ort_run(convert_onnx_to_fp16(data), x)
    assert outputs_agree(half, want, rel_tol=SELF_CHECK_REL_TOL["fp16"])[0]
    wrong = onnx.load_from_string(data)
    w2 = next(t for t in wrong.graph.initializer if t.name == "w2")
    changed = numpy_helper.to_array(w2).copy()
    changed[0] = -changed[0]
    w2.CopyFrom(numpy_helper.from_array(changed, "w2"))
    assert not outputs_agree(ort_run(wrong.SerializeToString(), x), want,
                             rel_tol=SELF_CHECK_REL_TOL["fp16"])[0]


def test_self_check_without_tensorrt_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    tensorrt_self_check.cache_clear()
    try:
        ok, why = tensorrt_self_check("fp16")
    finally:
        tensorrt_self_check.cache_clear()
    assert ok is False and why.startswith("TensorRT is not installed:"), why


def test_auto_without_tensorrt_falls_back_and_logs_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """`neural.runner=auto` where TensorRT cannot be imported: the runner chosen is another one, the
    log says why, and that runner computes the model right."""
    from swapstream.engines.select import make_runner

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    tensorrt_self_check.cache_clear()
    data, x, want = self_check_case()
    path = tmp_path / "check.onnx"
    path.write_bytes(data)
    caplog.set_level(logging.INFO, logger="swapstream.engines.select")
    try:
        runner = make_runner(path, "auto", precision="fp32")
    finally:
        tensorrt_self_check.cache_clear()
    assert runner.name != "tensorrt"
    lines = [r.getMessage() for r in caplog.records if r.name == "swapstream.engines.select"]
    assert any(line.startswith(f"runner for check.onnx: {runner.name} (TensorRT unavailable (TensorRT "
                               f"is not installed:") for line in lines), lines
    with runner:
        got = runner.infer({"x": x})["y"]
    assert outputs_agree(np.asarray(got), want, rel_tol=1e-5)[0]


@needs_trt
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_self_check_passes_on_a_working_tensorrt(trt_ready: None, cp: object, precision: str,
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPSTREAM_ENGINE_CACHE", str(tmp_path))
    tensorrt_self_check.cache_clear()
    try:
        ok, why = tensorrt_self_check(precision)  # type: ignore[arg-type]
    finally:
        tensorrt_self_check.cache_clear()
    assert ok, why
    assert f"{precision} self-check passed (relative error" in why
    from swapstream.engines.select import choose_runner

    assert choose_runner("auto", precision=precision)[0] == "tensorrt"
