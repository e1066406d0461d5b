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
