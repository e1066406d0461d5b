"""ONNX Runtime runner: the CPU path (CI) and, where installed, the CUDA and TensorRT providers."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .runner import FeedError, Runner, RunnerError, TensorSpec, array_module_name

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(uint8)": np.dtype(np.uint8),
}


def ort_providers(preference: str = "auto") -> list[str]:
    """Providers to ask for, best first, among those this onnxruntime build has."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    wanted = {"auto": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
              "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
              "cpu": ["CPUExecutionProvider"]}[preference]
    return [p for p in wanted if p in have]


class OnnxRuntimeRunner(Runner):
    """Runs an ONNX model with ONNX Runtime. Feeds are NumPy arrays (CuPy arrays are copied to the
    host first, because the CPU provider cannot read device memory)."""

    name = "onnxruntime"

    def __init__(self, model: str | Path | bytes, *, providers: str = "auto", threads: int = 0) -> None:
        super().__init__()
        self._model = model
        self._providers = providers
        self._threads = threads
        self._session: Any = None

    def _activate_impl(self) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if self._threads:
            opts.intra_op_num_threads = self._threads
        # Quiet: ORT warns about unused initializers (inswapper's emap), which is expected.
        opts.log_severity_level = 3
        providers = ort_providers(self._providers)
        src = self._model if isinstance(self._model, bytes) else str(self._model)
        try:
            self._session = ort.InferenceSession(src, sess_options=opts, providers=providers)
        except Exception as e:  # ORT raises its own exception types for unreadable models
            what = "model bytes" if isinstance(self._model, bytes) else f"'{self._model}'"
            raise RunnerError(f"onnxruntime cannot load {what}: {str(e).splitlines()[0]}") from e
        log.info("onnxruntime providers: %s", self._session.get_providers())
        self.inputs = [TensorSpec(i.name, tuple(i.shape), _ORT_TYPES.get(i.type, np.dtype(np.float32)))
                       for i in self._session.get_inputs()]
        self.outputs = [TensorSpec(o.name, tuple(o.shape), _ORT_TYPES.get(o.type, np.dtype(np.float32)))
                        for o in self._session.get_outputs()]

    def _deactivate_impl(self) -> None:
        self._session = None

    def _infer_impl(self, feed: dict[str, Any], stream: Any) -> dict[str, Any]:
        host = {}
        for k, v in feed.items():
            mod = array_module_name(v)
            if mod == "cupy":
                host[k] = v.get(stream=stream)
            elif mod == "numpy":
                host[k] = v
            else:
                raise FeedError(f"onnxruntime: input '{k}' must be a NumPy or CuPy array, got {mod}")
        outs = self._session.run([o.name for o in self.outputs], host)
        return {o.name: a for o, a in zip(self.outputs, outs)}
