"""Run a `.tflite` graph in PyTorch, so that the built-in MediaPipe face models run batched on the GPU.

LiteRT runs only on the CPU here. Its GPU delegate targets OpenGL/OpenCL on phones, and a 1080p frame
would first have to come back to the host. The two networks the GPU pipeline needs (BlazeFace short
range and Face Mesh) are small plain convnets, so we read the flatbuffer with the `tflite` schema
package and execute its operators with torch. It is an interpreter of the file, not a hand-written
port, so it stays correct if the file changes within the supported operator set.

Layout: TFLite is NHWC. Inside the module, every 4-D tensor is kept NCHW (cuDNN's native layout), and
operators whose meaning depends on the axis order (PAD, CONCATENATION, RESHAPE, PRELU) translate it.
Inputs and outputs are NHWC, as in the file.

Supported operators: DEQUANTIZE (fp16 weights, folded at load), CONV_2D, DEPTHWISE_CONV_2D, ADD,
RELU, PRELU, MAX_POOL_2D, PAD, RESHAPE, CONCATENATION, and for MediaPipe Hands RESIZE_BILINEAR
(half-pixel), MEAN, FULLY_CONNECTED and LOGISTIC. Anything else is refused when the file is read,
naming the operator. The full-range BlazeFace model uses sparse weights (DENSIFY), which are not.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .runner import RunnerError

log = logging.getLogger(__name__)

_NP_TYPES = {0: np.float32, 1: np.float16, 2: np.int32, 4: np.int64}
"""tflite.TensorType -> NumPy (FLOAT32, FLOAT16, INT32, INT64: all these models use)."""
_NHWC_TO_NCHW_AXIS = {0: 0, 1: 2, 2: 3, 3: 1}
_SUPPORTED = ("DEQUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "RELU", "PRELU", "MAX_POOL_2D",
              "PAD", "RESHAPE", "CONCATENATION", "RESIZE_BILINEAR", "MEAN", "FULLY_CONNECTED",
              "LOGISTIC")


@dataclass
class TfliteOp:
    """One operator: its name, tensor indices and the options that matter to us."""

    kind: str
    inputs: list[int]
    outputs: list[int]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TfliteGraph:
    """A parsed single-subgraph model: shapes, constants and operators in execution order."""

    name: str
    shapes: dict[int, tuple[int, ...]]
    constants: dict[int, np.ndarray]
    ops: list[TfliteOp]
    inputs: list[int]
    outputs: list[int]
    tensor_names: dict[int, str]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shapes[self.inputs[0]]


def _options(op: Any, kind: str) -> dict[str, Any]:
    import tflite

    table = op.BuiltinOptions()
    if table is None:
        return {}
    if kind == "CONV_2D" or kind == "DEPTHWISE_CONV_2D":
        o = tflite.Conv2DOptions() if kind == "CONV_2D" else tflite.DepthwiseConv2DOptions()
        o.Init(table.Bytes, table.Pos)
        d = {"stride": (o.StrideH(), o.StrideW()), "dilation": (o.DilationHFactor(), o.DilationWFactor()),
             "same": o.Padding() == tflite.Padding.SAME, "act": o.FusedActivationFunction()}
        if kind == "DEPTHWISE_CONV_2D":
            d["multiplier"] = o.DepthMultiplier()
        return d
    if kind == "MAX_POOL_2D":
        o = tflite.Pool2DOptions()
        o.Init(table.Bytes, table.Pos)
        return {"stride": (o.StrideH(), o.StrideW()), "kernel": (o.FilterHeight(), o.FilterWidth()),
                "same": o.Padding() == tflite.Padding.SAME, "act": o.FusedActivationFunction()}
    if kind == "ADD":
        o = tflite.AddOptions()
        o.Init(table.Bytes, table.Pos)
        return {"act": o.FusedActivationFunction()}
    if kind == "CONCATENATION":
        o = tflite.ConcatenationOptions()
        o.Init(table.Bytes, table.Pos)
        return {"axis": o.Axis(), "act": o.FusedActivationFunction()}
    if kind == "RESIZE_BILINEAR":
        o = tflite.ResizeBilinearOptions()
        o.Init(table.Bytes, table.Pos)
        return {"align_corners": bool(o.AlignCorners()), "half_pixel": bool(o.HalfPixelCenters())}
    if kind == "MEAN":
        o = tflite.ReducerOptions()
        o.Init(table.Bytes, table.Pos)
        return {"keep_dims": bool(o.KeepDims())}
    if kind == "FULLY_CONNECTED":
        o = tflite.FullyConnectedOptions()
        o.Init(table.Bytes, table.Pos)
        return {"act": o.FusedActivationFunction(), "keep_dims": bool(o.KeepNumDims()),
                "weights_format": o.WeightsFormat()}
    if kind == "RESHAPE":
        o = tflite.ReshapeOptions()
        o.Init(table.Bytes, table.Pos)
        return {"new_shape": [int(v) for v in o.NewShapeAsNumpy()]} if o.NewShapeLength() else {}
    return {}


def read_tflite(path: str | Path) -> TfliteGraph:
    """Parse a `.tflite` file; raises RunnerError for files we cannot execute, naming what is missing."""
    try:
        import tflite
    except ImportError:
        raise RunnerError("the 'tflite' package is needed to run the built-in face models on the GPU "
                          "(pip install tflite==2.18.0)") from None
    path = Path(path)
    buf = path.read_bytes()
    model = tflite.Model.GetRootAs(buf, 0)
    if model.SubgraphsLength() != 1:
        raise RunnerError(f"{path.name}: {model.SubgraphsLength()} subgraphs; only single-graph models "
                          f"are supported")
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    g = model.Subgraphs(0)
    shapes: dict[int, tuple[int, ...]] = {}
    constants: dict[int, np.ndarray] = {}
    tnames: dict[int, str] = {}
    for i in range(g.TensorsLength()):
        t = g.Tensors(i)
        shapes[i] = tuple(int(s) for s in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        tnames[i] = t.Name().decode()
        data = model.Buffers(t.Buffer()).DataAsNumpy() if t.Buffer() else 0
        # Sparse constants only feed DENSIFY, which the operator check below refuses by name.
        if isinstance(data, np.ndarray) and data.size and t.Sparsity() is None:
            if t.Type() not in _NP_TYPES:
                raise RunnerError(f"{path.name}: tensor '{tnames[i]}' has unsupported type {t.Type()}")
            constants[i] = data.view(_NP_TYPES[t.Type()]).reshape(shapes[i]).copy()
    ops: list[TfliteOp] = []
    for i in range(g.OperatorsLength()):
        op = g.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        kind = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
        if kind not in _SUPPORTED:
            raise RunnerError(f"{path.name}: operator {kind} is not supported by the PyTorch executor "
                              f"(supported: {', '.join(_SUPPORTED)}); run this model with LiteRT")
        ops.append(TfliteOp(kind, [int(v) for v in op.InputsAsNumpy()],
                            [int(v) for v in op.OutputsAsNumpy()], _options(op, kind)))
    return TfliteGraph(path.name, shapes, constants, ops, [int(v) for v in g.InputsAsNumpy()],
                       [int(v) for v in g.OutputsAsNumpy()], tnames)


def _same_pads(size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TensorFlow's SAME padding: the extra pixel, if any, goes after (bottom/right)."""
    eff = (k - 1) * dilation + 1
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + eff - size, 0)
    return total // 2, total - total // 2


def build_module(graph: TfliteGraph) -> Any:
    """A torch.nn.Module that executes `graph`; call it with an NHWC float tensor (any batch size)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    acts = {0: lambda x: x, 1: F.relu, 3: lambda x: F.relu6(x)}

    def act(code: int, kind: str) -> Any:
        if code not in acts:
            raise RunnerError(f"{graph.name}: fused activation {code} of {kind} is not supported")
        return acts[code]

    class TfliteModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            consts = {i: c.astype(np.float32) if c.dtype == np.float16 else c
                      for i, c in graph.constants.items()}
            # DEQUANTIZE of a constant is folded here: its output is the fp32 weight.
            self._alias: dict[int, int] = {}
            steps: list[tuple[str, list[int], list[int], dict[str, Any]]] = []
            params: dict[str, np.ndarray] = {}
            for op in graph.ops:
                o = dict(op.options)
                if op.kind == "DEQUANTIZE" and op.inputs[0] in consts:
                    consts[op.outputs[0]] = consts[op.inputs[0]].astype(np.float32)
                    continue
                if op.kind == "CONV_2D":
                    w = consts[op.inputs[1]]  # O, KH, KW, I
                    params[f"w{len(steps)}"] = np.ascontiguousarray(w.transpose(0, 3, 1, 2))
                    o["k"] = w.shape[1:3]
                elif op.kind == "DEPTHWISE_CONV_2D":
                    w = consts[op.inputs[1]]  # 1, KH, KW, C*mult
                    params[f"w{len(steps)}"] = np.ascontiguousarray(w[0].transpose(2, 0, 1)[:, None])
                    o["k"] = w.shape[1:3]
                    o["groups"] = w.shape[3] // max(o.get("multiplier", 1), 1)
                if op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
                    if len(op.inputs) > 2 and op.inputs[2] >= 0:
                        params[f"b{len(steps)}"] = consts[op.inputs[2]].astype(np.float32)
                    o["act_fn"] = act(o["act"], op.kind)
                elif op.kind == "PRELU":
                    a = consts[op.inputs[1]]
                    # NHWC-trailing alpha ([C], [H, W, C] or [1, H, W, C]) -> broadcastable NCHW.
                    if a.ndim == 1:
                        a = a.reshape(1, -1, 1, 1)
                    else:
                        a = a.reshape((1,) + a.shape[-3:]).transpose(0, 3, 1, 2)
                    params[f"a{len(steps)}"] = np.ascontiguousarray(a)
                elif op.kind in ("ADD", "MAX_POOL_2D", "CONCATENATION"):
                    o["act_fn"] = act(o.get("act", 0), op.kind)
                    if op.kind == "ADD":
                        for j in op.inputs:
                            if j in consts:
                                params[f"c{j}"] = self._to_internal(consts[j])
                elif op.kind == "PAD":
                    o["pads"] = consts[op.inputs[1]].astype(np.int64).tolist()
                elif op.kind == "RESIZE_BILINEAR":
                    # TF's half-pixel mode is torch's align_corners=False; TF's legacy mode (neither
                    # flag: source = destination * scale, no half-pixel offset) has no torch twin.
                    if not (o["half_pixel"] or o["align_corners"]):
                        raise RunnerError(f"{graph.name}: RESIZE_BILINEAR without half_pixel_centers "
                                          f"or align_corners is not supported")
                    o["size"] = [int(v) for v in consts[op.inputs[1]].reshape(-1)]
                elif op.kind == "MEAN":
                    o["axes"] = [int(v) for v in consts[op.inputs[1]].reshape(-1)]
                elif op.kind == "FULLY_CONNECTED":
                    if o["weights_format"] != 0 or o["keep_dims"]:
                        raise RunnerError(f"{graph.name}: FULLY_CONNECTED with shuffled weights or "
                                          f"keep_num_dims is not supported")
                    params[f"w{len(steps)}"] = consts[op.inputs[1]].astype(np.float32)  # out, in
                    if len(op.inputs) > 2 and op.inputs[2] >= 0:
                        params[f"b{len(steps)}"] = consts[op.inputs[2]].astype(np.float32)
                    o["act_fn"] = act(o["act"], op.kind)
                elif op.kind == "RESHAPE":
                    if "new_shape" not in o:
                        o["new_shape"] = consts[op.inputs[1]].astype(np.int64).tolist()
                steps.append((op.kind, op.inputs, op.outputs, o))
            for k, v in params.items():
                self.register_buffer(k, torch.from_numpy(np.ascontiguousarray(v)))
            self._steps = steps
            self._rank = {i: len(s) for i, s in graph.shapes.items()}

        @staticmethod
        def _to_internal(c: np.ndarray) -> np.ndarray:
            return c.transpose(0, 3, 1, 2) if c.ndim == 4 else c

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            env: dict[int, torch.Tensor] = {graph.inputs[0]: x.permute(0, 3, 1, 2)}
            for n, (kind, ins, outs, o) in enumerate(self._steps):
                a = env.get(ins[0])
                if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
                    (kh, kw), (sh, sw), (dh, dw) = o["k"], o["stride"], o["dilation"]
                    pad: tuple[int, int] = (0, 0)
                    if o["same"]:
                        t, b = _same_pads(a.shape[2], kh, sh, dh)
                        left, r = _same_pads(a.shape[3], kw, sw, dw)
                        if t == b and left == r:
                            # Even padding is the convolution's own zero padding: no separate pad
                            # kernel (14 of Face Mesh's 21 SAME convolutions, all its stride-1 ones).
                            pad = (t, left)
                        else:  # TF puts the odd pixel after: only an explicit pad says that
                            a = F.pad(a, (left, r, t, b))
                    bias = getattr(self, f"b{n}", None)
                    y = F.conv2d(a, getattr(self, f"w{n}"), bias, (sh, sw), pad, (dh, dw),
                                 o.get("groups", 1))
                    y = o["act_fn"](y)
                elif kind == "ADD":
                    u = env[ins[0]] if ins[0] in env else getattr(self, f"c{ins[0]}")
                    v = env[ins[1]] if ins[1] in env else getattr(self, f"c{ins[1]}")
                    y = o["act_fn"](u + v)
                elif kind == "RELU":
                    y = F.relu(a)
                elif kind == "PRELU":
                    alpha = getattr(self, f"a{n}")
                    if alpha.shape[2:] == (1, 1):
                        # One slope per channel: torch's PReLU, one kernel where the `where` form
                        # below takes three (compare, multiply, select). Face Mesh's 23 PReLUs are
                        # all of this kind, and its fixed cost per call is kernel count (about
                        # 0.57 ms for one face, 0.96 for 16: docs/benchmarks/frame_gpu.md).
                        # x if x > 0 else slope * x either way: the same values.
                        y = F.prelu(a, alpha.reshape(-1))
                    else:
                        y = torch.where(a >= 0, a, a * alpha)
                elif kind == "MAX_POOL_2D":
                    (kh, kw), (sh, sw) = o["kernel"], o["stride"]
                    if o["same"]:
                        t, b = _same_pads(a.shape[2], kh, sh)
                        left, r = _same_pads(a.shape[3], kw, sw)
                        if t or b or left or r:
                            # Padded cells never win a max in TFLite: pad with -inf.
                            a = F.pad(a, (left, r, t, b), value=float("-inf"))
                    y = o["act_fn"](F.max_pool2d(a, (kh, kw), (sh, sw)))
                elif kind == "PAD":
                    p = o["pads"]
                    if a.dim() == 4:  # NHWC pads, NCHW tensor: (W, H, C) pairs for F.pad
                        y = F.pad(a, (p[2][0], p[2][1], p[1][0], p[1][1], p[3][0], p[3][1]))
                    else:
                        flat = [v for pair in reversed(p) for v in pair]
                        y = F.pad(a, flat)
                elif kind == "RESHAPE":
                    if a.dim() == 4:
                        a = a.permute(0, 2, 3, 1)
                    shape = [a.shape[0]] + [int(s) for s in o["new_shape"][1:]]
                    y = a.reshape(shape)
                    if y.dim() == 4:
                        y = y.permute(0, 3, 1, 2)
                elif kind == "RESIZE_BILINEAR":
                    y = F.interpolate(a, size=tuple(o["size"]), mode="bilinear",
                                      align_corners=o["align_corners"])
                elif kind == "MEAN":
                    axes = [ax % a.dim() for ax in o["axes"]]
                    if a.dim() == 4:
                        axes = [_NHWC_TO_NCHW_AXIS[ax] for ax in axes]
                    y = a.mean(dim=axes, keepdim=o["keep_dims"])
                elif kind == "FULLY_CONNECTED":
                    if a.dim() == 4:  # TFLite flattens in NHWC order
                        a = a.permute(0, 2, 3, 1)
                    y = o["act_fn"](F.linear(a.reshape(a.shape[0], -1), getattr(self, f"w{n}"),
                                             getattr(self, f"b{n}", None)))
                elif kind == "LOGISTIC":
                    y = torch.sigmoid(a)
                elif kind == "CONCATENATION":
                    parts = [env[i] for i in ins]
                    axis = o["axis"] % parts[0].dim()
                    if parts[0].dim() == 4:
                        axis = _NHWC_TO_NCHW_AXIS[axis]
                    y = o["act_fn"](torch.cat(parts, dim=axis))
                else:  # DEQUANTIZE of a runtime tensor
                    y = a.float()
                env[outs[0]] = y
            return [env[i].permute(0, 2, 3, 1) if env[i].dim() == 4 else env[i] for i in graph.outputs]

    module = TfliteModule()
    # torch.compile keeps its compiled graphs, and its limit of 8 of them, per code object, and
    # every module built here shares this forward's: the fifth analyser of a process (each compiles
    # a detector graph and its landmark sizes) would hit the limit, an error under fullgraph. A
    # copy of the code object per module gives each its own cache and limit.
    fwd = TfliteModule.forward
    own = types.FunctionType(fwd.__code__.replace(), fwd.__globals__, fwd.__name__, fwd.__defaults__,
                             fwd.__closure__)
    module.forward = types.MethodType(own, module)
    return module


_CUDNN_FLAGS = threading.Lock()
"""Held while `_exact_fp32` has changed cuDNN's flags. They are process-wide in torch, set on entry
and restored on exit: two threads inside at once (a serve worker's analysis thread and its swap
thread analysing a source face) could restore in the wrong order and leave benchmark mode and TF32
off for the whole process. The lock guards torch's global state, so it is global too."""


@contextmanager
def _exact_fp32() -> Iterator[None]:
    """cuDNN without TF32, for this block only: TF32 would cost ~1e-3 relative error per layer,
    and the landmarks feed a geometry that the tests compare against LiteRT's."""
    import torch

    with _CUDNN_FLAGS, torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=False,
                                                  allow_tf32=False):
        yield


@contextmanager
def _on_cupy_stream(x: Any, cache: dict[int, Any]) -> Iterator[None]:
    """Run torch on CuPy's current stream when the input is a CuPy array, so that the model is
    ordered after the kernels that made its input (and before those that read its output) without
    a sync; NumPy input runs on torch's own current stream. `cache` keeps one torch stream object
    per CuPy stream: making one costs more than the model's launch."""
    if not type(x).__module__.startswith("cupy"):
        yield
        return
    import cupy
    import torch

    ptr = cupy.cuda.get_current_stream().ptr
    ext = cache.get(ptr)
    if ext is None:
        ext = cache.setdefault(ptr, torch.cuda.ExternalStream(ptr))
    with torch.cuda.stream(ext):
        yield


def bucket_sizes(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, then `max_batch`: 16 -> [1, 2, 4, 8, 16], 6 -> [1, 2, 4, 6]."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return sizes + [max_batch]


class PendingOutputs:
    """A batch's outputs on their way to host memory (`TfliteTorchRunner.run_async`)."""

    def __init__(self, host: list[Any], done: Any) -> None:
        self._host = host
        self._done = done  # a torch.cuda.Event recorded after the copies; None on the CPU

    def result(self) -> list[np.ndarray]:
        """The outputs as NumPy arrays, once their copies are done (the wait happens here)."""
        if self._done is not None:
            self._done.synchronize()
        return [t.numpy() for t in self._host]


class TfliteTorchRunner:
    """LiteRTRunner's interface (`input_shape`, `run`, `close`) over a `.tflite` file executed by torch.

    `run` takes NHWC float32 input, NumPy or CuPy, with any batch size up to `max_batch`, and returns
    the outputs as NumPy arrays (the one device-to-host copy, which is also the sync point).
    On CUDA, each batch size is captured once into a CUDA graph on first use and replayed after: these
    nets are ~200 tiny kernels, and launching them one by one from Python would cost more than running
    them.
    """

    def __init__(self, model_path: str | Path, *, device: str = "cuda", max_batch: int = 4,
                 cuda_graphs: bool = True, compile: bool = False) -> None:
        """`compile` (CUDA with graphs only): torch.compile the module. Inductor fuses each
        convolution's bias, PReLU and residual add into one kernel around cuDNN's convolutions, and
        these nets' time per call is mostly their kernel count. Batch sizes then run in the graph
        of the next power of two (`buckets`): compiling costs seconds per graph at start-up, and
        a padded row costs little next to a call's fixed cost."""
        import torch

        self.path = Path(model_path)
        self.graph = read_tflite(self.path)
        self.input_shape: tuple[int, ...] = self.graph.input_shape
        self.input_dtype = np.dtype(np.float32)
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.module = build_module(self.graph).to(self.device).eval()
        self.compile = compile and self.cuda_graphs
        self._fn: Any = self.module
        if self.compile:
            self._fn = torch.compile(self.module, fullgraph=True, dynamic=False)
        self.buckets: list[int] = bucket_sizes(max_batch) if self.compile else list(range(1, max_batch + 1))
        """The batch sizes that have their own graph; a call runs in the smallest one that holds it."""
        self._graphs: dict[int, tuple[Any, Any, list[Any]]] = {}
        self._streams: dict[int, Any] = {}

    def _torch_input(self, x: Any) -> Any:
        import torch

        if type(x).__module__.startswith("cupy"):
            return torch.from_dlpack(x)
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device, non_blocking=False)

    def _check(self, x: Any) -> None:
        want = self.input_shape[1:]
        if x.ndim != 4 or tuple(x.shape[1:]) != want or x.dtype != np.float32 \
                or not 1 <= x.shape[0] <= self.max_batch:
            raise ValueError(f"{self.path.name}: input must be float32 (N, {', '.join(map(str, want))}) "
                             f"with 1 <= N <= {self.max_batch}, got {x.dtype} {tuple(x.shape)}")

    def run_torch(self, x: Any) -> list[Any]:
        """Like `run`, but returns torch tensors on the device, without a host copy or sync.

        With CUDA graphs the tensors are the graph's static outputs (or their first rows): they are
        overwritten by the next call that runs in the same graph, that is of the same batch size or,
        with `compile`, of the same bucket (a call of 3 overwrites what a call of 4 returned), so use
        (or copy) them before that.
        """
        import torch

        self._check(x)
        with torch.inference_mode(), _exact_fp32(), _on_cupy_stream(x, self._streams):
            return self._run(x)

    def _run(self, x: Any) -> list[Any]:
        """One batch on torch's current stream (the caller has entered the stream context)."""
        t = self._torch_input(x)
        if not self.cuda_graphs:
            return self.module(t.to(self.device))
        n = int(t.shape[0])
        size = self.bucket(n)
        entry = self._graphs.get(size)
        if entry is None:
            entry = self._capture(size)
        graph, static_in, static_out = entry
        # Rows past n keep an earlier call's input: every row is computed on its own (no layer
        # mixes the batch), so they cost time but change nothing, and their outputs are cut off.
        static_in[:n].copy_(t)
        graph.replay()
        return static_out if size == n else [o[:n] for o in static_out]

    def bucket(self, n: int) -> int:
        """The graph's batch size that a call of `n` runs in."""
        return next(b for b in self.buckets if b >= n)

    def prepare(self, batches: Iterable[int]) -> list[int]:
        """Capture the CUDA graphs of these batch sizes now; returns the sizes captured so far.

        A batch size's first call costs seconds (cuDNN picks and builds kernels for the new shapes:
        2-3 s for Face Mesh on the H200), so a live job captures every size it may use before its
        first frame instead of relying on warm-up frames to reach each size."""
        import torch

        if self.cuda_graphs:
            with torch.inference_mode(), _exact_fp32():
                for n in batches:
                    if not 1 <= n <= self.max_batch:
                        raise ValueError(f"{self.path.name}: batch {n} is outside 1..{self.max_batch}")
                    size = self.bucket(n)
                    if size not in self._graphs:
                        self._capture(size)
        return self.captured

    @property
    def captured(self) -> list[int]:
        """The batch sizes that have a CUDA graph (a growing list during a live run means stalls);
        with `compile`, these are `buckets`."""
        return sorted(self._graphs)

    def _capture(self, n: int) -> tuple[Any, Any, list[Any]]:
        import torch

        t0 = time.perf_counter()
        static_in = torch.zeros((n, *self.input_shape[1:]), dtype=torch.float32, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # compile, and warm up cuDNN's algorithm choice, before capture
                self._fn(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (aiortc's decoder thread feeding NVDEC, allocating from
        # CuPy's pool) may go on with calls a capture forbids; only this thread is checked.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_out = self._fn(static_in)
        self._graphs[n] = (graph, static_in, static_out)
        # Info, not debug: a capture in the middle of a live stream is a stall worth seeing.
        log.info("%s: captured a CUDA graph for batch %d in %.0f ms", self.path.name, n,
                 (time.perf_counter() - t0) * 1e3)
        return self._graphs[n]

    def run(self, x: Any) -> list[np.ndarray]:
        """Run one batch; outputs in the model's declared order, as NumPy copies."""
        return self.run_async(x).result()

    def run_async(self, x: Any) -> PendingOutputs:
        """`run` without the wait: the model and the copies of its outputs to (pinned) host memory
        are queued, and `result()` waits for them. A caller with other work to launch meanwhile
        (the next streams' swaps) does it before `result()` instead of idling in the copy.

        The copies are ordered after the replay on the same stream, and so before the next replay
        of the same graph (batch size, or bucket with `compile`) on that stream. Calls made meanwhile from another stream (or with
        NumPy input, on torch's stream) are not ordered with them and could overwrite the graph's
        outputs first: keep the calls of one runner on one stream while a result is pending."""
        import torch

        self._check(x)
        # The copies to the host must be ordered on the stream the model ran on (CuPy's, for CuPy
        # input), so they happen inside the same stream context. non_blocking makes torch copy
        # into pinned memory and return at once; the event marks when the copies are done. They
        # are queued right after the replay, so the graph's static outputs are read before any
        # later replay can overwrite them.
        with torch.inference_mode(), _exact_fp32(), _on_cupy_stream(x, self._streams):
            outs = self._run(x)
            if self.device.type != "cuda":
                return PendingOutputs([o.detach().cpu() for o in outs], None)
            host = [o.detach().to("cpu", non_blocking=True) for o in outs]
            done = torch.cuda.Event()
            done.record()
        return PendingOutputs(host, done)

    def close(self) -> None:
        self._graphs.clear()
        self.module = self._fn = None
