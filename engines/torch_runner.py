"""PyTorch runner: native modules in fp16 + channels_last, one CUDA graph per batch size.

It runs on CuPy-owned streams through `torch.cuda.ExternalStream` and reads and writes CuPy buffers
through DLPack, so no frame data crosses the host. On a machine without CUDA it runs the same
module in fp32 eagerly on the CPU (that is what CI exercises).
"""

from __future__ import annotations

import contextlib
import itertools

import logging
from collections import deque
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .runner import FeedError, Runner, RunnerError, TensorSpec, array_module_name
from .native import native_for
from .torch_models import onnx_initializers

log = logging.getLogger(__name__)

# Compiled variants dynamo may keep per model class: 4 batch sizes for each of up to 64 runners of one
# architecture in a process (the tests build many; a serve worker builds a few).
_RECOMPILE_LIMIT = 256

Precision = Literal["auto", "fp16", "fp32"]


def pick_precision(precision: Precision, device: str) -> str:
    """fp16 only where Tensor Cores run it (compute capability 7.0 or higher), else fp32."""
    if precision != "auto":
        return precision
    if device == "cpu":
        return "fp32"
    import torch

    major, _ = torch.cuda.get_device_capability()
    return "fp16" if major >= 7 else "fp32"


class TorchRunner(Runner):
    """Runs a model from an ONNX file with a native PyTorch module (or onnx2torch as a fallback).

    Outputs returned on the GPU are views of static buffers (one set per batch size and stream) that
    the next call with that batch size overwrites; copy them if they must live longer.
    """

    name = "torch"

    def __init__(self, onnx_model: str | Path | Any, *, device: str = "auto",
                 precision: Precision = "auto", max_batch: int = 4, cuda_graphs: bool = True,
                 channels_last: bool = True, check_finite: bool = True,
                 finite_check: str = "sync",
                 compile: bool = False) -> None:
        super().__init__()
        self._src = onnx_model
        self._device_pref = device
        self._precision_pref = precision
        self.max_batch = max_batch
        self.cuda_graphs = cuda_graphs
        self.channels_last = channels_last
        self.check_finite = check_finite
        if finite_check not in ("sync", "deferred"):
            raise ValueError(f"finite_check must be 'sync' or 'deferred', got {finite_check!r}")
        self.finite_check = finite_check
        """`sync` (check each output, rerun a bad batch in fp32) or `deferred` (see _sanitise_deferred)."""
        self.nonfinite_batches = 0
        """With `deferred`: batches whose non-finite output was zeroed."""
        self._finite_flags: deque[tuple[Any, Any, Any]] = deque()
        self._flag_pool: list[Any] = []
        self._streams: dict[int, Any] = {}
        self.compile = compile
        """torch.compile the module (Inductor fuses the element-wise glue between convolutions into
        Triton kernels); costs tens of seconds per batch size at start-up."""
        self.fp32_reruns = 0
        """Calls whose fp16 output had NaN or Inf and were run again in fp32."""
        self.graph_failures = 0
        self._graphs: dict[tuple[int, int], Any] = {}
        self._module: Any = None
        self._module32: Any = None
        self._module32_on_device: Any = None
        self._eager: Any = None

    # -- loading ------------------------------------------------------------------------------

    def _activate_impl(self) -> None:
        import onnx
        import torch

        model = self._src if hasattr(self._src, "graph") else onnx.load(str(self._src))
        self._onnx = model
        dev = self._device_pref
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = dev
        self.precision = pick_precision(self._precision_pref, dev)
        inits = onnx_initializers(model)
        native = native_for(inits)
        if native is None:
            module = self._fallback(model)
            self.architecture = "onnx2torch"
        else:
            module = native.build(inits)
            self.architecture = native.architecture
        if self.architecture == "bisenet":
            # Only the first head is read (FaceFusion's `[0]`); the two auxiliary heads are training
            # aids, and one tensor out keeps the CUDA-graph and fp32-rerun paths single-output.
            module.first_only = True
        dtype = torch.float16 if self.precision == "fp16" else torch.float32
        if dev != "cpu":
            # cuDNN autotuning picks the fastest convolution for each fixed shape (we have four batch
            # sizes, each captured once). In fp32, TF32 would cost ~1e-3 relative error, ten times
            # the fp32 contract: turn it off. Both are process-wide torch settings.
            torch.backends.cudnn.benchmark = True
            if self.precision == "fp32":
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
        # The fp32 module stays on the host until an fp16 batch overflows and needs a rerun.
        self._module32 = module
        self._module32_on_device = None
        import copy

        module = copy.deepcopy(module).to(device=dev)
        if dtype != torch.float32 and hasattr(module, "mixed_precision"):
            # Codebook models (CodeFormer, RestoreFormer++) keep what picks their codes in fp32: an
            # fp16 pick flips near ties, and one flipped code moves the whole face (docs/neural.md,
            # "Enhancers in PyTorch"). The module says which part may run in `dtype`.
            module.mixed_precision(dtype)
            if dev != "cpu":
                # Their fp32 part must be fp32: TF32 rounds to fp16's 10-bit mantissa and brings the
                # flips back. Process-wide, as in fp32 mode; fp16 work is not affected.
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
        else:
            module = module.to(dtype=dtype)
        if self.channels_last and dev != "cpu":
            # The 4-D tensors alone: `module.to(memory_format=...)` refuses a module that also holds
            # others of rank 5, as GFPGAN's modulated convolutions do (their per-sample weights).
            for t in itertools.chain(module.parameters(), module.buffers()):
                if t.dim() == 4:
                    t.data = t.data.contiguous(memory_format=torch.channels_last)
        self._module = module.eval()
        self._eager = self._module
        if self.compile and dev != "cpu":
            # Static shapes: one compiled variant per batch size, each then captured in its graph.
            # Compilation happens lazily, at the first call of each batch size (see _replay).
            self._module = torch.compile(self._module, dynamic=False, fullgraph=True)
        init_names = set(inits)
        elem = {1: np.float32, 10: np.float16}
        self.inputs = [TensorSpec(i.name, tuple(d.dim_param or (d.dim_value or None)
                                                for d in i.type.tensor_type.shape.dim),
                                  np.dtype(elem.get(i.type.tensor_type.elem_type, np.float32)))
                       for i in model.graph.input if i.name not in init_names]
        self.outputs = [TensorSpec(o.name, tuple(d.dim_param or (d.dim_value or None)
                                                 for d in o.type.tensor_type.shape.dim),
                                   np.dtype(np.float32)) for o in model.graph.output]
        if self.architecture == "bisenet":
            self.outputs = self.outputs[:1]
        log.info("torch runner: %s on %s in %s, CUDA graphs %s", self.architecture, dev,
                 self.precision, "on" if self.cuda_graphs and dev != "cpu" else "off")

    def _fallback(self, model: Any) -> Any:
        try:
            from onnx2torch import convert
        except ImportError:
            raise RunnerError("this model has no native PyTorch module and onnx2torch is not "
                              "installed; use the onnxruntime or tensorrt runner") from None
        log.warning("no native module for this model: converting with onnx2torch (slow, and not "
                    "capturable in a CUDA graph)")
        self.cuda_graphs = False
        return convert(model)

    def _deactivate_impl(self) -> None:
        self._graphs.clear()
        self._module = None

    # -- running ------------------------------------------------------------------------------

    def _to_torch(self, name: str, a: Any) -> Any:
        import torch

        mod = array_module_name(a)
        if mod == "torch":
            t = a
        elif mod == "cupy":
            t = torch.from_dlpack(a)
        elif mod == "numpy":
            t = torch.from_numpy(np.ascontiguousarray(a))
        else:
            raise FeedError(f"torch: input '{name}' must be a NumPy, CuPy or torch array, got {mod}")
        return t.to(self.device, non_blocking=True)

    def _run_module(self, module: Any, args: list[Any]) -> Any:
        import torch

        # Dynamo keeps its compiled variants on the shared `forward` code of the model's class: each
        # runner of an architecture adds one per batch size, and its default limit of 8 failed the
        # third inswapper runner in one process (4 batch sizes each; fullgraph=True makes that an
        # error). The limit is raised only while our compiled modules run, since it is torch's
        # process-wide setting; a call that hits no new shape does not compile at all.
        limits = torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT) if module is not self._eager \
            and self.compile else contextlib.nullcontext()
        with limits, torch.inference_mode():
            if self.channels_last and self.device != "cpu":
                args = [a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args]
            return module(*args)

    def _infer_impl(self, feed: dict[str, Any], stream: Any) -> dict[str, Any]:
        import torch

        args = [self._to_torch(s.name, feed[s.name]) for s in self.inputs]
        batch = int(args[0].shape[0])
        if batch > self.max_batch:
            raise FeedError(f"torch: batch {batch} is larger than max_batch {self.max_batch}")
        if self.device == "cpu":
            out = self._run_module(self._module, args)
            return {self.outputs[0].name: out.numpy()}
        if stream is None:
            # The caller's current stream is CuPy's (every GPU caller here queues its crops on
            # it): torch's own current stream would be the legacy default one, unordered with a
            # non-blocking CuPy stream (a race on the inputs) and one that no graph can be
            # captured on.
            import cupy

            stream = cupy.cuda.get_current_stream()
        if int(stream.ptr) == 0:
            ext = torch.cuda.default_stream(torch.device(self.device))
        else:
            # One torch object per CuPy stream: making one per call costs ~0.1 ms of host time.
            ext = self._streams.get(stream.ptr)
            if ext is None:
                ext = self._streams.setdefault(stream.ptr, torch.cuda.ExternalStream(stream.ptr))
        with torch.cuda.stream(ext):
            out = self._replay(batch, args, ext) if self.cuda_graphs else self._run_module(self._module, args)
            if self.check_finite and self.precision == "fp16" and self.finite_check == "deferred":
                out = self._sanitise_deferred(out)
            elif self.check_finite and self.precision == "fp16" and not bool(torch.isfinite(out).all()):
                # fp16 overflowed somewhere in this batch: run it again in fp32, and count it.
                self.fp32_reruns += 1
                log.warning("non-finite fp16 output: rerunning the batch in fp32 (%d so far)",
                            self.fp32_reruns)
                if self._module32_on_device is None:
                    self._module32_on_device = self._module32.to(self.device)
                out = self._run_module(self._module32_on_device, args)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("torch: batch %d, output %s %s, %d MB allocated", batch, out.dtype,
                      tuple(out.shape), torch.cuda.memory_allocated() >> 20)
        import cupy

        return {self.outputs[0].name: cupy.from_dlpack(out)}

    def _sanitise_deferred(self, out: Any) -> Any:
        """The `deferred` overflow guard: no host wait. Non-finite values are zeroed on the GPU, and
        whether there were any is copied to pinned memory and read once that copy has completed
        (usually at the next call), when the batch is counted in `nonfinite_batches`.

        The flag goes through CuPy's pinned memory and a raw async copy, not a pinned torch tensor:
        torch's host allocator records an event on the copy's stream when such a tensor is freed,
        and the stream (a caller's CuPy stream) may be gone by then, which aborts the process."""
        import cupy
        import cupyx
        import torch

        while self._finite_flags and self._finite_flags[0][2].done:
            host, _dev, _ev = self._finite_flags.popleft()
            if not bool(host[0]):
                self.nonfinite_batches += 1
                log.warning("non-finite fp16 output zeroed (%d batches so far); use "
                            "neural.finite_check=sync to rerun such batches in fp32", self.nonfinite_batches)
            self._flag_pool.append(host)
        host = self._flag_pool.pop() if self._flag_pool else cupyx.empty_pinned((1,), np.bool_)
        dev = torch.isfinite(out).all().reshape(1)  # kept alive in the queue until its copy is done
        ptr = torch.cuda.current_stream().cuda_stream
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data_ptr(), 1,
                                      cupy.cuda.runtime.memcpyDeviceToHost, ptr)
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(cupy.cuda.ExternalStream(ptr))
        self._finite_flags.append((host, dev, ev))
        return torch.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)

    def _replay(self, batch: int, args: list[Any], ext: Any) -> Any:
        """Copy the inputs into this batch size's static buffers and replay its graph (capturing it
        on first use). Falls back to eager execution if capture fails."""
        import torch

        key = (batch, int(ext.cuda_stream))
        entry = self._graphs.get(key)
        if entry is None:
            static_in = [a.clone() for a in args]
            # No graph can be captured on the legacy default stream: a caller on it gets its graph
            # captured on a side stream ordered after it, and replayed on its own stream.
            cap = ext if int(ext.cuda_stream) != 0 else torch.cuda.Stream(device=ext.device)
            try:
                cap.wait_stream(ext)
                with torch.cuda.stream(cap):
                    # Warm up on the capture stream (cuDNN picks algorithms, allocators settle).
                    for _ in range(2):
                        self._run_module(self._module, static_in)
                    cap.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    # thread_local: see engines/tflite_torch.py (other threads may allocate meanwhile).
                    with torch.cuda.graph(graph, stream=cap, capture_error_mode="thread_local"):
                        static_out = self._run_module(self._module, static_in)
                ext.wait_stream(cap)
                entry = (graph, static_in, static_out)
            except RuntimeError as e:
                if self._module is not self._eager:
                    # Inductor could not compile here (no Triton, no C compiler...): go on with
                    # the plain module, still in CUDA graphs.
                    log.warning("torch.compile failed (%s): using the uncompiled module",
                                str(e).splitlines()[0][:200])
                    self._module = self._eager
                    self.compile = False
                    return self._replay(batch, args, ext)
                self.graph_failures += 1
                log.warning("CUDA graph capture failed for batch %d (%s): running eagerly", batch,
                            str(e).splitlines()[0])
                self.cuda_graphs = False
                return self._run_module(self._module, args)
            self._graphs[key] = entry
        graph, static_in, static_out = entry
        for dst, src in zip(static_in, args):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return static_out
