"""The PyTorch executor of the built-in .tflite models against LiteRT, on the CPU (CI) and the GPU."""

from __future__ import annotations

from fractions import Fraction
from types import ModuleType

import numpy as np
import pytest

from swapstream.config import load_config
from swapstream.demo import astronaut, grace_hopper
from swapstream.engines.builtin import builtin_model_path
from swapstream.engines.litert import LiteRTRunner
from swapstream.engines.runner import RunnerError
from swapstream.types import Frame

torch = pytest.importorskip("torch")

from swapstream.engines.tflite_torch import TfliteTorchRunner  # noqa: E402
from swapstream.gpu.analyser import GpuFaceAnalyser  # noqa: E402

MODELS = ["face_detection_short_range.tflite", "face_landmark.tflite"]
# MediaPipe Hands (mask.hands): RESIZE_BILINEAR in the palm detectors, MEAN, FULLY_CONNECTED and
# LOGISTIC in the landmark models. Their inputs are in [0, 1]; the comparison below feeds [-1, 1],
# which exercises the same operators over a wider range.
HAND_MODELS = ["palm_detection_lite.tflite", "palm_detection_full.tflite", "hand_landmark_lite.tflite",
               "hand_landmark_full.tflite"]


@pytest.fixture
def cuda(cp: ModuleType) -> ModuleType:
    """The conftest's CuPy-with-a-device check, plus torch's own view of CUDA."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return cp


@pytest.mark.parametrize("name", MODELS + HAND_MODELS)
def test_cpu_executor_matches_litert(name: str) -> None:
    path = builtin_model_path(name, load_config().models_dir)
    ref = LiteRTRunner(path)
    ours = TfliteTorchRunner(path, device="cpu", max_batch=2)
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, (2, *ref.input_shape[1:])).astype(np.float32)
    got = ours.run(x)
    for b in range(2):
        want = ref.run(x[b:b + 1])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape[1:] == w.shape[1:]
            # Both are fp32, with different convolution algorithms (XNNPACK vs oneDNN) and summation
            # orders: rounding differences grow through ~50 layers to ~1e-6 of the output's range
            # (outputs reach ~150); 2e-5 of the range leaves margin and still catches any layout slip.
            np.testing.assert_allclose(g[b:b + 1], w, rtol=0, atol=2e-5 * max(1.0, float(np.abs(w).max())))


def test_sparse_model_is_refused_by_name() -> None:
    path = builtin_model_path("face_detection_full_range_sparse.tflite", load_config().models_dir)
    with pytest.raises(RunnerError, match="DENSIFY"):
        TfliteTorchRunner(path, device="cpu")


def test_batch_and_dtype_are_checked() -> None:
    path = builtin_model_path("face_landmark.tflite", load_config().models_dir)
    r = TfliteTorchRunner(path, device="cpu", max_batch=2)
    with pytest.raises(ValueError, match="1 <= N <= 2"):
        r.run(np.zeros((3, 192, 192, 3), np.float32))
    with pytest.raises(ValueError, match="float32"):
        r.run(np.zeros((1, 192, 192, 3), np.float64))


def _compare_analysers(device: str, upload: bool) -> None:
    from swapstream.face.analyser import FaceAnalyser

    cfg = load_config()
    ref, ours = FaceAnalyser(cfg), GpuFaceAnalyser(cfg, device=device)
    try:
        for img in (grace_hopper(), astronaut()):
            want = ref.analyse_image(img)
            got = ours.analyse_image(img)
            assert len(got) == len(want) == 1
            data = img
            if upload:
                import cupy

                data = cupy.asarray(img)
                # The detector's GPU letterbox (one crop launch) against the CPU one: the boxes and
                # key points seed the landmark ROIs, so a pixel or two is harmless; more is a bug.
                dw, dg = ref.detect(img), ours.detect(data)
                assert len(dw) == len(dg) >= 1
                np.testing.assert_allclose(dg[0].box, dw[0].box, rtol=0, atol=2.0)
                np.testing.assert_allclose(dg[0].keypoints, dw[0].keypoints, rtol=0, atol=2.0)
            for i in range(4):
                w = ref.track(Frame(img, i, Fraction(1, 30), i))
                g = ours.track(Frame(data, i, Fraction(1, 30), i))
                assert len(g) == len(w) == 1
                # Same networks in fp32; the GPU crop skips the CPU path's rounding of the crop to
                # uint8 (< 0.5 grey level): landmarks agree to a small fraction of a pixel on faces
                # ~100-200 px wide.
                np.testing.assert_allclose(g[0].landmarks, w[0].landmarks, rtol=0, atol=0.25)
                np.testing.assert_allclose(g[0].kps, w[0].kps, rtol=0, atol=0.25)
    finally:
        ref.close()
        ours.close()


def test_analyser_with_torch_on_cpu_matches_litert() -> None:
    _compare_analysers("cpu", upload=False)


@pytest.mark.gpu
def test_gpu_analyser_on_cupy_frames_matches_cpu(cuda: ModuleType) -> None:
    _compare_analysers("cuda", upload=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS + HAND_MODELS)
def test_gpu_executor_matches_litert(cuda: ModuleType, name: str) -> None:
    cupy = cuda

    path = builtin_model_path(name, load_config().models_dir)
    ref = LiteRTRunner(path)
    ours = TfliteTorchRunner(path, device="cuda", max_batch=4)
    rng = np.random.default_rng()
    for n in (1, 3, 1):  # graph capture per batch size, then replay of an existing one
        x = rng.uniform(-1, 1, (n, *ref.input_shape[1:])).astype(np.float32)
        got = ours.run(cupy.asarray(x))
        for b in range(n):
            for g, w in zip(got, ref.run(x[b:b + 1])):
                # fp32 with TF32 off; cuDNN's algorithms sum in other orders than XNNPACK.
                np.testing.assert_allclose(g[b:b + 1], w, rtol=0, atol=5e-5 * max(1.0, float(np.abs(w).max())))


def test_bucket_sizes_are_powers_of_two_then_the_limit() -> None:
    from swapstream.engines.tflite_torch import bucket_sizes

    assert bucket_sizes(1) == [1]
    assert bucket_sizes(4) == [1, 2, 4]
    assert bucket_sizes(6) == [1, 2, 4, 6]
    assert bucket_sizes(16) == [1, 2, 4, 8, 16]
    path = builtin_model_path("face_landmark.tflite", load_config().models_dir)
    # Without CUDA graphs there is nothing to compile into: every size runs as itself.
    r = TfliteTorchRunner(path, device="cpu", max_batch=3, compile=True)
    assert not r.compile and r.buckets == [1, 2, 3] and r.bucket(3) == 3


def test_each_module_compiles_under_its_own_limit() -> None:
    # torch.compile counts its graphs per code object, with a hard error past the limit under
    # fullgraph. Modules of one file share a forward; each must get its own count, or a process's
    # fifth compiled analyser fails. The limit is lowered to 2 here so that three modules show it.
    import torch._dynamo

    from swapstream.engines.tflite_torch import build_module, read_tflite

    graph = read_tflite(builtin_model_path("face_detection_short_range.tflite", load_config().models_dir))
    x = torch.rand(1, *graph.input_shape[1:])
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=2), torch.inference_mode():
        outs = [torch.compile(build_module(graph).eval(), backend="eager", fullgraph=True, dynamic=False)(x)
                for _ in range(3)]
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # same weights, same input, same path


@pytest.mark.gpu
def test_gpu_compiled_executor_matches_litert(cuda: ModuleType) -> None:
    # torch.compile'd graphs in buckets: a call of 3 runs in the graph of 4, whose fourth row still
    # holds the last call's input; the rows returned must be this call's, each equal to LiteRT's.
    cupy = cuda
    rng = np.random.default_rng()
    for name, max_batch, sizes, graphs in (("face_landmark.tflite", 4, (4, 3, 1), [1, 4]),
                                          ("face_detection_short_range.tflite", 1, (1,), [1])):
        path = builtin_model_path(name, load_config().models_dir)
        ref = LiteRTRunner(path)
        ours = TfliteTorchRunner(path, device="cuda", max_batch=max_batch, compile=True)
        assert ours.compile
        for n in sizes:
            x = rng.uniform(-1, 1, (n, *ref.input_shape[1:])).astype(np.float32)
            got = ours.run(cupy.asarray(x))
            for b in range(n):
                want = ref.run(x[b:b + 1])
                for g, w in zip(got, want):
                    assert g.shape[0] == n and g.shape[1:] == w.shape[1:]
                    # fp32 with TF32 off, as uncompiled; Inductor's fused bias/PReLU/add kernels
                    # round like the separate ones (each one fp32 op), only the order of sums of
                    # cuDNN's algorithms differs from XNNPACK's.
                    np.testing.assert_allclose(g[b:b + 1], w, rtol=0,
                                               atol=5e-5 * max(1.0, float(np.abs(w).max())))
        assert ours.captured == graphs
        ours.close()


@pytest.mark.gpu
def test_gpu_run_async_keeps_each_calls_outputs(cuda: ModuleType) -> None:
    # Two calls of one batch size replay one CUDA graph into the same static outputs. Each
    # run_async queues its host copy before the next replay, so both results must survive being
    # read after the second call (the first one read last).
    cupy = cuda
    path = builtin_model_path("face_landmark.tflite", load_config().models_dir)
    ref = LiteRTRunner(path)
    ours = TfliteTorchRunner(path, device="cuda", max_batch=2)
    rng = np.random.default_rng()
    xs = [rng.uniform(0, 1, (2, *ref.input_shape[1:])).astype(np.float32) for _ in range(2)]
    ours.run(cupy.asarray(xs[0]))  # capture outside the comparison
    pending = [ours.run_async(cupy.asarray(x)) for x in xs]
    for x, p in reversed(list(zip(xs, pending))):
        got = p.result()
        for b in range(2):
            for g, w in zip(got, ref.run(x[b:b + 1])):
                # As in test_gpu_executor_matches_litert: fp32, other summation orders than XNNPACK.
                np.testing.assert_allclose(g[b:b + 1], w, rtol=0, atol=5e-5 * max(1.0, float(np.abs(w).max())))


@pytest.mark.gpu
def test_gpu_track_many_matches_one_stream_at_a_time(cuda: ModuleType) -> None:
    # Four streams' landmark crops in one model call (cropped from four CuPy frames) against each
    # stream tracked alone: same faces, same ids, landmarks within fp32 noise of the batch size.
    from swapstream.face.analyser import track_many

    cupy = cuda
    cfg = load_config(overrides=["smoothing.enabled=false"])
    shared = GpuFaceAnalyser(cfg)
    # Four different frames: the portraits, mirrored and shifted, so that a mix-up of crops
    # between streams shows.
    images = [grace_hopper(), astronaut(), grace_hopper()[:, ::-1].copy(), np.roll(astronaut()[:, ::-1], 24, axis=1).copy()]
    frames = [cupy.asarray(img) for img in images]
    alone = [shared.tracker() for _ in images]
    together = [shared.tracker() for _ in images]
    try:
        for i in range(5):
            want = [a.track(Frame(f, i, Fraction(1, 30), i)) for a, f in zip(alone, frames)]
            got = track_many([(a, Frame(f, i, Fraction(1, 30), i)) for a, f in zip(together, frames)])
            for w, g in zip(want, got):
                assert len(w) == len(g) == 1 and w[0].track_id == g[0].track_id
                # Batch 4 against batch 1 in fp32 (TF32 off): cuDNN may pick other algorithms per
                # batch size, which sum in other orders: far below a thousandth of a pixel.
                np.testing.assert_allclose(g[0].landmarks, w[0].landmarks, rtol=0, atol=1e-3)
    finally:
        shared.close()


@pytest.mark.gpu
def test_gpu_analyser_prepare_captures_every_size_before_use(cuda: ModuleType) -> None:
    # prepare() must leave nothing to capture mid-stream: after it, tracking up to mesh_batch faces
    # at once adds no graph, and the prepared graphs give the same landmarks as capture-on-use.
    from swapstream.face.analyser import track_many

    cupy = cuda
    cfg = load_config(overrides=["smoothing.enabled=false"])
    prepared = GpuFaceAnalyser(cfg, mesh_batch=3)
    lazy = GpuFaceAnalyser(cfg, mesh_batch=3)
    try:
        assert prepared.prepare() == {"landmarks": [1, 2, 3], "detector": [1]}
        runner = prepared._mesh.runner
        images = [grace_hopper(), astronaut(), grace_hopper()[:, ::-1].copy()]
        frames = [cupy.asarray(img) for img in images]
        mine = [prepared.tracker() for _ in images]
        theirs = [lazy.tracker() for _ in images]
        for i in range(3):
            got = track_many([(a, Frame(f, i, Fraction(1, 30), i)) for a, f in zip(mine, frames)])
            want = track_many([(a, Frame(f, i, Fraction(1, 30), i)) for a, f in zip(theirs, frames)])
            for w, g in zip(want, got):
                assert len(w) == len(g) == 1
                # Same graphs and inputs on the same GPU: only cuDNN's choice may differ by run.
                np.testing.assert_allclose(g[0].landmarks, w[0].landmarks, rtol=0, atol=1e-3)
        assert runner.captured == [1, 2, 3]
        with pytest.raises(ValueError, match="outside 1..3"):
            runner.prepare([4])
    finally:
        prepared.close()
        lazy.close()


@pytest.mark.parametrize(("max_faces", "want"), [(1, 1), (2, 2), (4, 4), (8, 4)])
def test_gpu_analyser_landmark_batch_follows_max_faces(max_faces: int, want: int) -> None:
    # One frame never has more tracks than detector.max_faces, so the landmark batch (and the CUDA
    # graphs prepare() captures) stops there, up to MAX_FACES_PER_CALL; an explicit size wins.
    cfg = load_config(overrides=[f"detector.max_faces={max_faces}"])
    a = GpuFaceAnalyser(cfg, device="cpu")
    b = GpuFaceAnalyser(cfg, device="cpu", mesh_batch=16)
    try:
        assert a._mesh.max_batch == want and b._mesh.max_batch == 16
        assert a.prepare() == {"landmarks": [], "detector": []}  # no CUDA graphs on the CPU
    finally:
        a.close()
        b.close()
