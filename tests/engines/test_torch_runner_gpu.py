"""The torch runner against ONNX Runtime on the CPU, batch 1-4, fp16 and fp32 (`pytest -m gpu`)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from ..zoo_models import make_test_models  # noqa: E402

from swapstream.engines.ort_runner import OnnxRuntimeRunner  # noqa: E402
from swapstream.engines.torch_runner import TorchRunner  # noqa: E402

pytestmark = pytest.mark.gpu


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


@pytest.mark.parametrize("precision,tol,compile", [
    # fp16 weights and activations carry ~3 decimal digits; 1e-2 is the contract.
    ("fp16", 1e-2, False),
    # The same with torch.compile: Inductor's fused kernels round in other places, same contract.
    ("fp16", 1e-2, True),
    # fp32 with TF32 off: only summation order differs from ONNX Runtime's CPU kernels.
    ("fp32", 1e-4, False),
])
def test_torch_runner_matches_onnxruntime(cp: ModuleType, precision: str, tol: float,
                                          compile: bool) -> None:
    pytest.importorskip("torch")
    model = make_test_models.inswapper(width=32, blocks=2, seed=3)
    rng = np.random.default_rng()
    stream = cp.cuda.Stream(non_blocking=True)
    with OnnxRuntimeRunner(model.SerializeToString(), providers="cpu") as ort, \
            TorchRunner(model, device="cuda", precision=precision, compile=compile) as tr:
        assert tr.architecture == "inswapper"
        for batch in (1, 2, 3, 4):
            for _ in range(2):  # the second call replays the captured graph
                target = rng.uniform(0, 1, (batch, 3, 128, 128)).astype(np.float32)
                source = rng.normal(0, 1, (batch, 512)).astype(np.float32)
                source /= np.linalg.norm(source, axis=1, keepdims=True)
                ref = ort.infer({"target": target, "source": source})["output"]
                out = tr.infer({"target": cp.asarray(target), "source": cp.asarray(source)}, stream)
                got = out["output"].get(stream=stream)
                stream.synchronize()
                assert got.shape == ref.shape and got.dtype == np.float32
                err = rel_err(got, ref)
                assert err <= tol, f"batch {batch}: relative error {err:.2e} > {tol}"
        assert tr.graph_failures == 0
        assert tr.compile == compile  # compiled for real, not silently fallen back


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_fp16_overflow_guard(cp: ModuleType, mode: str) -> None:
    """Inputs ~1e4 overflow fp16 inside the network. `sync` reruns the batch in fp32 (counted) and
    gives a finite answer; `deferred` zeroes the non-finite values without a host wait and counts the
    batch once its flag has come back."""
    model = make_test_models.inswapper(width=8, blocks=1, seed=3)
    rng = np.random.default_rng()
    src = rng.normal(0, 1, (1, 512)).astype(np.float32)
    src /= np.linalg.norm(src)
    big = {"target": cp.asarray(rng.uniform(0, 3e4, (1, 3, 128, 128)).astype(np.float32)),
           "source": cp.asarray(src)}
    stream = cp.cuda.Stream(non_blocking=True)
    with TorchRunner(model, device="cuda", precision="fp16", finite_check=mode) as r:
        out = cp.asarray(r.infer(big, stream)["output"]).copy()
        stream.synchronize()
        assert bool(cp.isfinite(out).all())
        if mode == "sync":
            assert r.fp32_reruns == 1
        else:
            r.infer(big, stream)  # reads the first call's flag (its copy has completed by now)
            stream.synchronize()
            assert r.nonfinite_batches >= 1 and r.fp32_reruns == 0


# The face stack's models (issue 23), in their real architectures with random weights: the runner
# as the product runs them on a GPU (fp16, channels_last, one CUDA graph per batch size) against
# ONNX Runtime in fp32 on the host.
ENHANCERS = ("gfpgan_1.4", "gpen_bfr_512", "codeformer", "restoreformer_plus_plus")
FACE_STACK = [
    # XSeg: a U-Net of 3x3 convolutions ending in a sigmoid; fp16 keeps ~3 decimal digits through
    # it, the runners' 1e-2 contract.
    ("xseg_1", "xseg", (256, 256, 3), 1e-2),
    # BiSeNet (ResNet-18): the same contract on its logits, and the labels (argmax) checked too.
    ("bisenet_resnet_18", "bisenet", (3, 512, 512), 1e-2),
    # GFPGAN v1.4: a StyleGAN2 decoder, 86 M parameters; the same contract.
    ("gfpgan_1.4", "gfpgan_1_4", (3, 512, 512), 1e-2),
    # GPEN-BFR-512: a StyleGAN2 generator fed by a U-Net encoder, 71 M parameters; the same contract.
    ("gpen_bfr_512", "gpen_bfr_512", (3, 512, 512), 1e-2),
    # CodeFormer and RestoreFormer++ pick codebook entries (arg max of logits, arg min of distances):
    # the runner keeps that part in fp32 (their `mixed_precision`), since an fp16 pick flips near ties
    # and one flip moves the whole face by 0.1-0.4; with fp32 codes the decoder's fp16 is the same contract.
    ("codeformer", "codeformer", (3, 512, 512), 1e-2),
    ("restoreformer_plus_plus", "restoreformer_plus_plus", (3, 512, 512), 1e-2),
]


@pytest.mark.parametrize("name,builder,shape,tol", FACE_STACK, ids=[c[0] for c in FACE_STACK])
def test_face_stack_models_fp16_with_graphs_match_onnxruntime(cp: ModuleType, name: str, builder: str,
                                                               shape: tuple[int, ...], tol: float) -> None:
    pytest.importorskip("torch")
    from ..zoo_models import make_face_models

    model = getattr(make_face_models, builder)(seed=0)
    rng = np.random.default_rng()
    stream = cp.cuda.Stream(non_blocking=True)
    with OnnxRuntimeRunner(model.SerializeToString(), providers="cpu") as ort, \
            TorchRunner(model, device="cuda", precision="fp16") as tr:
        assert tr.architecture == name.split("_")[0]  # the native module, not the ONNX fallback
        for batch in (1, 4):
            for rep in range(2):  # the second call replays the captured graph
                x = rng.random((batch, *shape), dtype=np.float32)
                if name in ENHANCERS:
                    x = x * 2 - 1  # their input range, [-1, 1]
                # CodeFormer's fidelity: float64 in the file (ONNX Runtime takes it so), float32 to torch.
                weight = {"weight": np.full((1,), 0.5)} if name == "codeformer" else {}
                ref = next(iter(ort.infer({"input": x, **weight}).values()))
                out = tr.infer({"input": cp.asarray(x), **{k: cp.asarray(v, np.float32) for k, v in weight.items()}},
                               stream)
                # Fresh inputs every call: a replay that left the graph's output buffer stale
                # would fail the comparison.
                got = next(iter(out.values())).get(stream=stream)
                stream.synchronize()
                assert got.shape == ref.shape and got.dtype == np.float32
                err = rel_err(got, ref)
                print(f"{name} batch {batch} call {rep}: relative L2 error {err:.2e}")
                assert np.isfinite(got).all() and err <= tol, f"{name} batch {batch}: {err:.2e} > {tol}"
                if name.startswith("bisenet"):
                    agree = float((got.argmax(1) == ref.argmax(1)).mean())
                    print(f"  labels agree on {agree:.4%} of pixels")
                    assert agree >= 0.99  # fp16 may flip near-ties between two classes, rarely
        assert tr.graph_failures == 0


@pytest.mark.parametrize("caller", ["cupy_nonblocking", "null_stream"])
def test_a_call_without_a_stream_runs_on_cupys_current_stream_in_graphs(cp: ModuleType, caller: str) -> None:
    """`infer(feed)` with no stream (how the face stack's masker and enhancer call it): it runs on the
    caller's current CuPy stream, ordered after the inputs written there, and still in CUDA graphs.
    It once fell to torch's default stream: no graph can be captured there (every batch ran eagerly,
    five times slower under `serve`), and it raced the non-blocking stream that wrote the inputs."""
    pytest.importorskip("torch")
    model = make_test_models.inswapper(width=32, blocks=2, seed=3)
    rng = np.random.default_rng()
    current = cp.cuda.Stream(non_blocking=True) if caller == "cupy_nonblocking" else cp.cuda.Stream.null
    with OnnxRuntimeRunner(model.SerializeToString(), providers="cpu") as ort, \
            TorchRunner(model, device="cuda", precision="fp32") as tr, current:
        for batch in (1, 4):
            for _ in range(3):  # capture, then replays
                target = rng.uniform(0, 1, (batch, 3, 128, 128)).astype(np.float32)
                source = rng.normal(0, 1, (batch, 512)).astype(np.float32)
                source /= np.linalg.norm(source, axis=1, keepdims=True)
                ref = ort.infer({"target": target, "source": source})["output"]
                # Big inputs written on the current stream right before the call, with a busy
                # kernel ahead of them: a runner on another stream would read them half-written.
                t_dev = cp.empty((batch, 3, 128, 128), cp.float32)
                t_dev.fill(np.nan)
                big = cp.ones((4096, 4096), cp.float32)
                for _ in range(4):
                    big = big @ big / 4096.0
                t_dev.set(target)
                out = tr.infer({"target": t_dev, "source": cp.asarray(source)})["output"]
                got = out.get()
                current.synchronize()
                # fp32, TF32 off: summation order alone differs from ONNX Runtime.
                assert rel_err(got, ref) <= 1e-4
        assert tr.graph_failures == 0 and tr.cuda_graphs
        assert all(k[1] == current.ptr for k in tr._graphs)  # keyed by (and replayed on) the caller's stream
