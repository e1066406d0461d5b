"""TensorRT runner: engines built from ONNX, cached on disk, run with `execute_async_v3` on CuPy
buffers and streams, with one CUDA graph per (stream, batch size).

Two TensorRT major versions are supported, and they differ in how fp16 is asked for:

- TensorRT 10 (weakly typed networks): `BuilderFlag.FP16` lets the builder pick fp16 kernels. The
  norm statistics are pinned to fp32 on the parsed network (`INormalizationLayer.compute_precision`,
  `ILayer.precision` / `set_output_type` under `BuilderFlag.PREFER_PRECISION_CONSTRAINTS`).
- TensorRT 11 (strongly typed only): the precision flags are gone ("Removed Python APIs and
  Replacements", TensorRT 11 migration guide: `BuilderFlag.FP16` -> "Strong typing with ModelOpt
  AutoCast"). Every tensor keeps the type the ONNX file gives it, so the ONNX model is converted to
  fp16 first, by `convert_onnx_to_fp16` below (NVIDIA's own answer is ModelOpt AutoCast, which we do
  not depend on). `NetworkDefinitionCreationFlag.STRONGLY_TYPED` is still passed where it exists: the
  11.0 Python docs keep it "for API compatibility", deprecated and ignored, strong typing being on.

Everything from `tensorrt` is imported inside functions, so this module imports (and its CPU tests run)
on machines without TensorRT. Sources the calls were checked against are cited where they are used;
none of this has run against a real TensorRT here (it cannot be installed on our machines).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .filelock import exclusive
from .paths import cache_dir, sha256_file
from .errors import EngineUserError, ModelMissingError
from .runner import FeedError, Runner, RunnerError, TensorSpec, array_module_name

log = logging.getLogger(__name__)
_trt_log = logging.getLogger(__name__ + ".trt")
"""TensorRT's own messages, forwarded by `_trt_logger`."""

Precision = Literal["fp16", "fp32"]
Progress = Callable[[str], None]

ENGINE_CACHE_ENV = "SWAPSTREAM_ENGINE_CACHE"
MIN_TENSORRT_MAJOR = 10
ENGINE_RECIPE = 1
"""Version of how this module turns an ONNX file into an engine (profile, flags, fp16 conversion). It is
part of the cache key so that changing the recipe never loads an engine built the old way; bump it
whenever build_engine or convert_onnx_to_fp16 changes what they produce."""

FP16_MAX = 65504.0
"""Largest finite float16; initializers beyond it are clipped rather than turned into inf."""


# ---------------------------------------------------------------------------------- availability

def _not_installed(exc: BaseException) -> str:
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return (f"TensorRT is not installed: {first} (install NVIDIA's `tensorrt` wheel from "
            "pypi.nvidia.com, or use the torch or onnxruntime runner)")


def _trt_major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 0


def tensorrt_available() -> tuple[bool, str]:
    """(usable, why): TensorRT 10+ imports and CuPy sees a CUDA device. The reason is one sentence a
    user can act on; when TensorRT is missing it starts with "TensorRT is not installed"."""
    try:
        import tensorrt as trt
    except Exception as exc:  # ImportError, or a broken install raising anything at import time
        return False, _not_installed(exc)
    version = str(getattr(trt, "__version__", "0"))
    if _trt_major(version) < MIN_TENSORRT_MAJOR:
        return False, (f"TensorRT {version} is too old: this runner needs TensorRT 10 or 11 "
                       "(named I/O tensors and execute_async_v3)")
    try:
        import cupy
    except Exception as exc:
        return False, (f"TensorRT {version} is installed but CuPy is not ({exc}); the TensorRT runner "
                       "keeps its buffers and streams in CuPy: pip install 'swapstream[gpu]'")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or a driver too old for this CUDA
        return False, f"TensorRT {version} is installed but CUDA is unusable: {exc}"
    if count == 0:
        return False, f"TensorRT {version} is installed but no CUDA device is visible"
    name, cc = gpu_identity()
    return True, f"TensorRT {version} on {name} (compute capability {cc})"


def _require_tensorrt() -> Any:
    """`tensorrt`, or the one-line EngineUserError that `tensorrt_available` gives."""
    ok, why = tensorrt_available()
    if not ok:
        raise EngineUserError(why)
    import tensorrt as trt

    return trt


def gpu_identity(device_id: int | None = None) -> tuple[str, str]:
    """(name, compute capability "major.minor") of a CUDA device, by default the current one."""
    import cupy

    dev = cupy.cuda.runtime.getDevice() if device_id is None else device_id
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return str(name), f"{props['major']}.{props['minor']}"


# ------------------------------------------------------------------------------------ engine cache

def default_engine_cache_dir() -> Path:
    """`$SWAPSTREAM_ENGINE_CACHE`, else `$XDG_CACHE_HOME/swapstream/engines` (~/.cache by default)."""
    return cache_dir(ENGINE_CACHE_ENV, "engines")


def _norm_cc(compute_capability: str | tuple[int, int]) -> str:
    if isinstance(compute_capability, tuple):
        return f"{compute_capability[0]}.{compute_capability[1]}"
    cc = str(compute_capability).strip()
    if re.fullmatch(r"\d+\.\d+", cc):
        return cc
    if re.fullmatch(r"\d{2,3}", cc):  # CuPy's Device.compute_capability spells 9.0 as "90"
        return f"{cc[:-1]}.{cc[-1]}"
    raise ValueError(f"compute capability must look like '9.0' or (9, 0), got {compute_capability!r}")


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")[:limit] or "x"


@dataclass(frozen=True)
class EngineCacheKey:
    """Everything an engine depends on (the GPU, the TensorRT version, the model's hash), plus how it
    was built. Two keys are equal exactly when one engine file can serve both."""

    model_sha256: str
    """SHA-256 of the ONNX file's bytes."""
    gpu_name: str
    """CUDA device name, e.g. "NVIDIA H200"; engines are tuned to one GPU model."""
    compute_capability: str
    """"major.minor"; an engine does not load on another architecture."""
    trt_version: str
    """Full TensorRT version; plans are not portable across versions."""
    precision: Precision
    """fp16 or fp32 build."""
    min_batch: int
    """Optimisation profile: smallest batch."""
    opt_batch: int
    """Batch the kernels are tuned for."""
    max_batch: int
    """Largest batch."""
    recipe: int = ENGINE_RECIPE
    """Version of this module's build recipe."""

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def filename(self, stem: str) -> str:
        """Readable, and unique through the digest of every field."""
        cc = self.compute_capability.replace(".", "")
        return (f"{_slug(stem)}-{self.precision}-b{self.min_batch}-{self.opt_batch}-{self.max_batch}"
                f"-{_slug(self.gpu_name, 24)}-sm{cc}-trt{_slug(self.trt_version, 16)}"
                f"-{self.digest()[:16]}.engine")


def make_engine_cache_key(onnx_path: str | Path, gpu_name: str,
                          compute_capability: str | tuple[int, int], trt_version: str,
                          precision: Precision, max_batch: int, *, min_batch: int = 1,
                          opt_batch: int | None = None, model_sha256: str | None = None) -> EngineCacheKey:
    """The key of the engine for `onnx_path` (hashing the file unless `model_sha256` is given)."""
    if precision not in ("fp16", "fp32"):
        raise ValueError(f"precision must be 'fp16' or 'fp32', got {precision!r}")
    opt = max_batch if opt_batch is None else opt_batch
    _check_batch_range(min_batch, opt, max_batch)
    return EngineCacheKey(
        model_sha256=model_sha256 or sha256_file(Path(onnx_path)), gpu_name=str(gpu_name),
        compute_capability=_norm_cc(compute_capability), trt_version=str(trt_version),
        precision=precision, min_batch=min_batch, opt_batch=opt, max_batch=max_batch)


def engine_cache_path(cache_dir: str | Path, onnx_path: str | Path, gpu_name: str,
                      compute_capability: str | tuple[int, int], trt_version: str, precision: Precision,
                      max_batch: int, *, min_batch: int = 1, opt_batch: int | None = None) -> Path:
    """Where the engine for this model, GPU, TensorRT version, precision and batch range lives."""
    key = make_engine_cache_key(onnx_path, gpu_name, compute_capability, trt_version, precision,
                                max_batch, min_batch=min_batch, opt_batch=opt_batch)
    return Path(cache_dir) / key.filename(Path(onnx_path).stem)


def timing_cache_path(cache_dir: str | Path, gpu_name: str, compute_capability: str | tuple[int, int],
                      trt_version: str) -> Path:
    """One timing cache per GPU model and TensorRT version: its timings are valid for every model built
    there (TensorRT checks a header and refuses a cache from another device or version)."""
    cc = _norm_cc(compute_capability).replace(".", "")
    return Path(cache_dir) / f"timing-{_slug(gpu_name, 24)}-sm{cc}-trt{_slug(trt_version, 16)}.cache"


def _check_batch_range(min_batch: int, opt_batch: int, max_batch: int) -> None:
    if not 1 <= min_batch <= opt_batch <= max_batch:
        raise EngineUserError(f"batch range must satisfy 1 <= min <= opt <= max, got min={min_batch} "
                              f"opt={opt_batch} max={max_batch}")


def _write_atomic(path: Path, data: bytes) -> None:
    # A reader (another process loading the cache) must never see half an engine.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ------------------------------------------------------------------------ fp16 ONNX conversion

_FLOAT = 1     # onnx.TensorProto.FLOAT
_FLOAT16 = 10  # onnx.TensorProto.FLOAT16

_NORM_OPS = frozenset({"InstanceNormalization", "LayerNormalization", "GroupNormalization"})
"""Ops that compute mean and variance inside; kept in fp32 whole."""
_STAT_FOLLOW = frozenset({"Sub", "Pow", "Add", "Sqrt", "Reciprocal", "ReduceMean"})
"""Ops a ReduceMean-based norm computes its statistics with (x - mean, square, mean, + eps, sqrt)."""
_STAT_REGION_MAX = 16
"""Bound on one norm region, so that a ReduceMean used as a pooling layer cannot pull a whole network
into fp32."""
_FP32_SLOTS: dict[str, frozenset[int]] = {"Resize": frozenset({1, 2}), "Upsample": frozenset({1})}
"""Inputs that stay float32 in an fp16 graph: Resize's `scales` is tensor(float) in the ONNX spec (its
`roi` may be float too), Upsample's `scales` likewise."""
_ANY_TYPE_OPS = frozenset({"Cast", "Shape", "Size"})
"""Ops that accept any input type: never insert a cast in front of them."""


def norm_statistics_nodes(graph: Any) -> set[int]:
    """Indices of the nodes that compute normalisation statistics, which stay in fp32.

    Inswapper's instance norm uses eps 1e-8 (docs/neural.md, "The inswapper_128 architecture"),
    below fp16's smallest subnormal (~6e-8), so in fp16 the eps becomes 0 and a flat channel gives
    0/0. Kept: InstanceNormalization, LayerNormalization and GroupNormalization nodes, and for each
    ReduceMean the nodes that follow it through Sub / square / ReduceMean / Add / Sqrt / Reciprocal,
    up to and including the Div or Mul that applies the statistics (not past it: the affine part and
    what follows run in fp16).
    """
    nodes = list(graph.node)
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(i)
    keep = {i for i, n in enumerate(nodes) if n.op_type in _NORM_OPS}
    for seed, node in enumerate(nodes):
        if node.op_type != "ReduceMean":
            continue
        region, queue = {seed}, [seed]
        while queue and len(region) < _STAT_REGION_MAX:
            j = queue.pop(0)
            for out in nodes[j].output:
                for k in consumers.get(out, []):
                    if k in region:
                        continue
                    op = nodes[k].op_type
                    ins = nodes[k].input
                    squares = op == "Mul" and len(ins) == 2 and ins[0] == ins[1]
                    if op in _STAT_FOLLOW or squares:
                        region.add(k)
                        queue.append(k)
                    elif op in ("Div", "Mul"):
                        region.add(k)  # applies the statistics: in fp32, but not followed further
        keep |= region
    return keep


def _elem_types(model: Any) -> dict[str, int]:
    """Element type of every tensor name, from the declared I/O, initializers and shape inference."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as exc:  # partial information still converts most graphs; the final check decides
        log.debug("shape inference failed before fp16 conversion: %s", exc)
        inferred = model
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in g.initializer:
        types[init.name] = init.data_type
    for node in g.node:  # Constant outputs, in case inference left them out
        if node.op_type == "Constant" and node.output and node.output[0] not in types:
            for a in node.attribute:
                if a.name == "value":
                    types[node.output[0]] = a.t.data_type
                elif a.name in ("value_float", "value_floats"):
                    types[node.output[0]] = _FLOAT
    return types


def _to_fp16_tensor(tensor: Any) -> Any:
    from onnx import numpy_helper

    arr = numpy_helper.to_array(tensor).astype(np.float32)
    if arr.size and float(np.max(np.abs(arr))) > FP16_MAX:
        log.warning("fp16 conversion: clipping %s to +-%g (values up to %g)", tensor.name or "a constant",
                    FP16_MAX, float(np.max(np.abs(arr))))
        arr = np.clip(arr, -FP16_MAX, FP16_MAX)
    return numpy_helper.from_array(arr.astype(np.float16), tensor.name)


def convert_onnx_to_fp16(model_bytes: bytes, *, keep_io_types: bool = True,
                         keep_norm_fp32: bool = True) -> bytes:
    """An fp16 version of a float32 ONNX model, for TensorRT 11's strongly typed networks.

    Float32 weights and activations become float16. With `keep_io_types` (the default) the graph's
    inputs and outputs stay float32, with Cast nodes just inside them, so callers feed and read the
    same arrays as with the fp32 model (and as TensorRT 10 builds it). With `keep_norm_fp32` the nodes
    of `norm_statistics_nodes` run in float32: their float inputs are cast up, their outputs cast back
    down, and constants used only by them (the eps) keep their exact float32 value. Resize scales stay
    float32 as the ONNX spec requires.

    Raises ValueError for what it cannot convert (control-flow subgraphs, model-local functions, or a
    result that fails ONNX's type check).
    """
    import onnx
    from onnx import helper, shape_inference

    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    try:  # the final check holds the result to the standard the input met, not a stricter one
        onnx.checker.check_model(model)
        input_valid = True
    except Exception:
        input_valid = False
    if len(model.functions):
        raise ValueError("models with local functions are not supported by the fp16 conversion")
    for node in graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise ValueError(f"control-flow node '{node.name or node.op_type}' ({node.op_type}) is not "
                             "supported by the fp16 conversion")

    types = _elem_types(model)
    nodes = list(graph.node)
    pinned = norm_statistics_nodes(graph) if keep_norm_fp32 else set()
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in inits]
    graph_outputs = [o.name for o in graph.output]
    io_type = _FLOAT if keep_io_types else _FLOAT16

    def is_float(name: str) -> bool:
        return types.get(name) == _FLOAT

    consumers: dict[str, list[tuple[int, int]]] = {}
    for i, node in enumerate(nodes):
        for slot, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((i, slot))

    def wants(i: int, slot: int) -> int | None:
        node = nodes[i]
        if node.op_type in _ANY_TYPE_OPS:
            return None
        if i in pinned or slot in _FP32_SLOTS.get(node.op_type, ()):
            return _FLOAT
        return _FLOAT16

    def needed_fp32(name: str) -> bool:
        return any(wants(i, s) == _FLOAT for i, s in consumers.get(name, [])) or (
            keep_io_types and name in graph_outputs)

    # The type each float tensor is produced in ("home"). Producers whose type we choose (constants,
    # casts to float) take float32 when some consumer needs float32, so that value is never rounded.
    home: dict[str, int] = {}
    for name in graph_inputs:
        if is_float(name):
            home[name] = io_type
    for name, init in inits.items():
        if init.data_type == _FLOAT and name in consumers:
            home[name] = _FLOAT if needed_fp32(name) else _FLOAT16
    for i, node in enumerate(nodes):
        cast_to_float = node.op_type == "Cast" and any(
            a.name == "to" and a.i == _FLOAT for a in node.attribute)
        for out in node.output:
            if not out or not is_float(out):
                continue
            if i in pinned:
                home[out] = _FLOAT
            elif node.op_type in ("Constant", "ConstantOfShape") or cast_to_float:
                home[out] = _FLOAT if needed_fp32(out) else _FLOAT16
            else:
                home[out] = _FLOAT16

    taken = {n for node in nodes for n in (*node.input, *node.output)} | set(inits) | set(graph_inputs)

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    # Graph outputs produced in the wrong type: the producer writes a renamed tensor and a Cast
    # produces the output under its original name (the name is the model's interface).
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    renamed: dict[str, str] = {}
    casts_after: dict[int | None, list[Any]] = {}  # producer node index (None: graph inputs/constants)
    cast_of: dict[tuple[str, int], str] = {}
    for out in graph_outputs:
        if out not in home or out not in producer:
            continue
        want = _FLOAT if keep_io_types else _FLOAT16
        if home[out] != want:
            inner = fresh(f"{out}__{'fp16' if home[out] == _FLOAT16 else 'fp32'}")
            renamed[out] = inner
            home[inner] = home[out]
            cast_of[(inner, want)] = out
            casts_after.setdefault(producer[out], []).append(
                helper.make_node("Cast", [inner], [out], to=want, name=f"{out}__cast_out"))

    def source(name: str) -> str:
        return renamed.get(name, name)

    def cast_to(name: str, to: int) -> str:
        key = (name, to)
        if key not in cast_of:
            cast_of[key] = fresh(f"{name}__{'fp16' if to == _FLOAT16 else 'fp32'}")
            where = producer.get(name) if name not in renamed.values() else producer.get(
                next(k for k, v in renamed.items() if v == name))
            casts_after.setdefault(where, []).append(
                helper.make_node("Cast", [name], [cast_of[key]], to=to, name=f"{cast_of[key]}__cast"))
        return cast_of[key]

    new_inputs: list[list[str]] = []
    for i, node in enumerate(nodes):
        ins = []
        for slot, name in enumerate(node.input):
            src = source(name) if name else name
            need = wants(i, slot) if name and src in home else None
            ins.append(cast_to(src, need) if need is not None and home[src] != need else src)
        new_inputs.append(ins)

    # Rewrite constants and producers whose type we changed.
    for name, init in inits.items():
        if home.get(name) == _FLOAT16:
            init.CopyFrom(_to_fp16_tensor(init))
    for i, node in enumerate(nodes):
        out = node.output[0] if node.output else ""
        if home.get(out) != _FLOAT16 or i in pinned:
            continue
        if node.op_type == "Constant":
            for a in list(node.attribute):
                if a.name == "value":
                    a.t.CopyFrom(_to_fp16_tensor(a.t))
                elif a.name in ("value_float", "value_floats"):
                    vals = np.asarray([a.f] if a.name == "value_float" else list(a.floats), np.float32)
                    vals = vals.reshape(()) if a.name == "value_float" else vals
                    node.attribute.remove(a)
                    node.attribute.append(helper.make_attribute(
                        "value", _to_fp16_tensor(onnx.numpy_helper.from_array(vals))))
        elif node.op_type == "ConstantOfShape":
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is None:  # the default value is a float32 zero
                node.attribute.append(helper.make_attribute(
                    "value", onnx.numpy_helper.from_array(np.zeros(1, np.float16))))
            else:
                value.t.CopyFrom(_to_fp16_tensor(value.t))
        elif node.op_type == "Cast":
            for a in node.attribute:
                if a.name == "to":
                    a.i = _FLOAT16

    rebuilt = list(casts_after.get(None, []))
    for i, node in enumerate(nodes):
        del node.input[:]
        node.input.extend(new_inputs[i])
        outs = [renamed.get(o, o) for o in node.output]
        del node.output[:]
        node.output.extend(outs)
        rebuilt.append(node)
        rebuilt.extend(casts_after.get(i, []))
    del graph.node[:]
    graph.node.extend(rebuilt)

    for vi in graph.input:
        if vi.name in inits:  # old-style models list initializers as inputs too
            if home.get(vi.name) == _FLOAT16:
                vi.type.tensor_type.elem_type = _FLOAT16
        elif is_float(vi.name):
            vi.type.tensor_type.elem_type = io_type
    for vi in graph.output:
        if is_float(vi.name):
            vi.type.tensor_type.elem_type = io_type
    # Intermediate type annotations are stale now; shape inference re-derives them below.
    graph.ClearField("value_info")

    try:
        if input_valid:
            onnx.checker.check_model(model)
        checked = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:
        raise ValueError(f"the fp16 version of the model does not type-check: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    return checked.SerializeToString()


# ------------------------------------------------------------------------------- engine building

@functools.cache
def _trt_logger() -> Any:
    """One ILogger that forwards TensorRT's messages to Python logging.

    Memoized for the process on purpose: TensorRT keeps a single logger pointer and warns, then ignores,
    a different logger passed to a later Builder or Runtime (NVIDIA/TensorRT#1475). The object has no
    state of its own; it only forwards.
    """
    import tensorrt as trt

    levels = {trt.ILogger.INTERNAL_ERROR: logging.CRITICAL, trt.ILogger.ERROR: logging.ERROR,
              trt.ILogger.WARNING: logging.WARNING, trt.ILogger.INFO: logging.DEBUG}

    class _ForwardingLogger(trt.ILogger):  # pattern of ILogger's docstring (python/docstrings pyCoreDoc.h)
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            # Called from C++ (noexcept): an exception escaping here would abort the process.
            try:
                level = levels.get(severity)
                if level is not None:
                    _trt_log.log(level, "%s", msg)
            except Exception:
                pass

    return _ForwardingLogger()


class _ErrorCollector(logging.Handler):
    """Keeps TensorRT's error messages during one build, for the message of a failed build."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _progress_monitor(trt: Any, say: Progress) -> Any:
    """An IProgressMonitor (TensorRT 10+) reporting "phase (step/steps)" lines; see NVIDIA's
    samples/python/simple_progress_monitor and IProgressMonitor's docstring in pyCoreDoc.h."""

    class _Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._steps: dict[str, int] = {}

        # TensorRT calls these from its own threads, inside noexcept C++: never let anything escape.
        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                self._steps[phase_name] = num_steps
                say(f"{phase_name} (0/{num_steps})")
            except Exception:
                pass

        def step_complete(self, phase_name: str, step: int) -> bool:
            try:
                say(f"{phase_name} ({step + 1}/{self._steps.get(phase_name, '?')})")
            except Exception:
                pass
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            try:
                self._steps.pop(phase_name, None)
            except Exception:
                pass

    return _Monitor()


def _parser_errors(parser: Any) -> list[str]:
    out = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        try:  # ParserError accessors (pyOnnxDoc.h): desc(), node(), node_name(), node_operator()
            where = f"node {err.node()}"
            name, op = err.node_name(), err.node_operator()
            if op or name:
                where += f" ({op} '{name}')" if name else f" ({op})"
            out.append(f"{where}: {err.desc()}")
        except Exception:
            out.append(str(err))
    return out


def _pin_norm_layers_fp32(trt: Any, network: Any, onnx_outputs: set[str]) -> int:
    """TensorRT 10 (weak typing): keep the norm statistics in fp32 under the FP16 flag.

    INormalizationLayer gets `compute_precision = float32`; the layers whose output tensors carry the
    ONNX names of the `norm_statistics_nodes` get `precision` and output type float32. The ONNX parser
    names each node's output tensor after the ONNX tensor (onnx-tensorrt ImporterContext::registerTensor),
    which is what the match relies on. Returns how many layers were pinned.
    """
    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        hit = False
        if layer.type == trt.LayerType.NORMALIZATION:
            # get_layer returns the base ILayer; Polygraphy re-classes layers the same way to reach
            # subclass attributes (polygraphy/backend/trt/util.py, get_layer_class_mapping).
            layer.__class__ = trt.INormalizationLayer
            layer.compute_precision = trt.float32
            hit = True
        for j in range(layer.num_outputs):
            out = layer.get_output(j)
            if out is not None and out.name in onnx_outputs and out.dtype == trt.float32:
                layer.precision = trt.float32
                layer.set_output_type(j, trt.float32)
                hit = True
        pinned += hit
    return pinned


def build_engine(onnx_path: str | Path, *, precision: Precision, min_batch: int = 1,
                 opt_batch: int = 4, max_batch: int = 4, timing_cache: Path | None = None,
                 progress: Progress | None = None) -> bytes:
    """Build a serialized TensorRT engine (a plan) from an ONNX file on the current CUDA device.

    Every input whose first dimension is dynamic gets one optimisation profile over
    `min_batch..max_batch`, tuned for `opt_batch`; other dimensions must be fixed. fp16 uses
    `BuilderFlag.FP16` on TensorRT 10 and a strongly typed network of the fp16-converted model on
    TensorRT 11. The timing cache, if given, is read before and written back after the build.
    Parser errors come back as one EngineUserError naming the file.
    """
    import onnx

    trt = _require_tensorrt()
    path = Path(onnx_path)
    if not path.is_file():
        raise ModelMissingError(f"ONNX file '{path}' does not exist")
    if precision not in ("fp16", "fp32"):
        raise EngineUserError(f"precision must be fp16 or fp32, got {precision!r}")
    _check_batch_range(min_batch, opt_batch, max_batch)
    say: Progress = progress or (lambda msg: log.info("%s: %s", path.name, msg))
    version = str(trt.__version__)
    major = _trt_major(version)

    collector = _ErrorCollector()
    _trt_log.addHandler(collector)
    try:
        logger = _trt_logger()
        builder = trt.Builder(logger)
        # TensorRT 10 and 11: networks are explicit-batch always; create_network(0) is what NVIDIA's
        # samples pass (simple_progress_monitor.py). STRONGLY_TYPED: 10.x strong typing, 11.x no-op.
        flags = 0
        strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if major >= 11 and strongly is not None:
            flags |= 1 << int(strongly)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)

        norm_outputs: set[str] = set()
        if precision == "fp16" and major >= 11:
            say(f"converting {path.name} to fp16 (TensorRT {version} builds strongly typed networks)")
            try:
                data = convert_onnx_to_fp16(onnx.load(str(path)).SerializeToString())
            except ValueError as exc:
                raise EngineUserError(f"cannot build an fp16 TensorRT {version} engine from '{path}': "
                                      f"{exc}; build it with precision fp32") from None
            say(f"parsing the fp16 version of {path.name}")
            ok = parser.parse(data)
        else:
            if precision == "fp16":
                graph = onnx.load(str(path), load_external_data=False).graph
                norm_outputs = {o for i in norm_statistics_nodes(graph) for o in graph.node[i].output if o}
            say(f"parsing {path.name}")
            # The path lets the parser find external weights (OnnxParser.parse docstring, pyOnnxDoc.h).
            ok = parser.parse(path.read_bytes(), str(path))
        if not ok or parser.num_errors:
            errors = _parser_errors(parser) or collector.messages or ["the parser gave no details"]
            raise EngineUserError(f"TensorRT {version} cannot parse '{path}': {'; '.join(errors)}")

        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        dynamic = []
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            shape = tuple(int(d) for d in tensor.shape)
            if any(d < 0 for d in shape[1:]):
                raise EngineUserError(
                    f"'{path}': input '{tensor.name}' has shape {shape}; only its first (batch) "
                    "dimension may vary. Export the model with fixed image sizes")
            if shape and shape[0] < 0:
                rest = shape[1:]
                profile.set_shape(tensor.name, (min_batch, *rest), (opt_batch, *rest), (max_batch, *rest))
                dynamic.append(tensor.name)
        if dynamic:
            if config.add_optimization_profile(profile) < 0:
                raise RunnerError(f"TensorRT rejected the batch profile {min_batch}-{max_batch} "
                                  f"for {dynamic}")
        elif max_batch > 1:
            say(f"{path.name} has a fixed batch size: the engine runs only that batch")

        if precision == "fp16" and major < 11:
            config.set_flag(trt.BuilderFlag.FP16)  # TensorRT 10 weak typing (removed in 11)
            pinned = _pin_norm_layers_fp32(trt, network, norm_outputs)
            if pinned:
                # PREFER, not OBEY: if a pinned layer has no fp32 kernel, TensorRT warns and builds anyway.
                config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
                say(f"kept {pinned} normalisation layers in fp32")

        cache = None
        if timing_cache is not None:
            # IBuilderConfig.create_timing_cache(b"") makes an empty cache; set_timing_cache(cache,
            # ignore_mismatch=False) refuses one from another device or version (pyCoreDoc.h).
            blob = timing_cache.read_bytes() if timing_cache.is_file() else b""
            try:
                cache = config.create_timing_cache(blob)
                if cache is None or not config.set_timing_cache(cache, False):
                    raise ValueError("rejected")
            except Exception:
                log.info("timing cache %s does not fit this GPU or TensorRT; starting a new one",
                         timing_cache)
                cache = config.create_timing_cache(b"")
                config.set_timing_cache(cache, False)

        monitor = None
        if hasattr(trt, "IProgressMonitor"):
            monitor = _progress_monitor(trt, say)
            config.progress_monitor = monitor  # must outlive the build: kept in `monitor` until return
        say(f"building the {precision} engine for batch {min_batch}-{max_batch} (minutes the first time)")
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            details = "; ".join(collector.messages[-3:]) or "see the TensorRT log (run with -v)"
            raise EngineUserError(f"TensorRT {version} could not build an engine from '{path}': {details}")
        if timing_cache is not None:
            timing_cache.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
        del monitor
        return bytes(memoryview(plan))
    finally:
        _trt_log.removeHandler(collector)


@dataclass(frozen=True)
class EngineBuildResult:
    """What `ensure_engine` did."""

    path: Path
    """The engine file."""
    built: bool
    """True if it was built now, False if it came from the cache."""
    seconds: float
    """Build time (0 for a cache hit)."""
    key: EngineCacheKey
    """Its cache key."""


def ensure_engine(onnx_path: str | Path, *, cache_dir: str | Path | None = None,
                  precision: Precision = "fp16", max_batch: int = 4, min_batch: int = 1,
                  opt_batch: int | None = None, progress: Progress | None = None,
                  force: bool = False) -> EngineBuildResult:
    """The cached engine for `onnx_path` on the current GPU, building and caching it if needed."""
    trt = _require_tensorrt()
    path = Path(onnx_path)
    if not path.is_file():
        raise ModelMissingError(f"ONNX file '{path}' does not exist")
    folder = Path(cache_dir) if cache_dir is not None else default_engine_cache_dir()
    gpu_name, cc = gpu_identity()
    key = make_engine_cache_key(path, gpu_name, cc, str(trt.__version__), precision, max_batch,
                                min_batch=min_batch, opt_batch=opt_batch)
    engine_path = folder / key.filename(path.stem)
    if engine_path.is_file() and not force:
        return EngineBuildResult(engine_path, False, 0.0, key)
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(engine_path.with_name(engine_path.name + ".lock")):
        if engine_path.is_file() and not force:  # another process built it while we waited
            return EngineBuildResult(engine_path, False, 0.0, key)
        t0 = time.perf_counter()
        plan = build_engine(path, precision=precision, min_batch=key.min_batch, opt_batch=key.opt_batch,
                            max_batch=key.max_batch,
                            timing_cache=timing_cache_path(folder, gpu_name, cc, key.trt_version),
                            progress=progress)
        seconds = time.perf_counter() - t0
        _write_atomic(engine_path, plan)
        meta = {**asdict(key), "onnx": str(path.resolve()), "build_seconds": round(seconds, 1),
                "built": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write_atomic(engine_path.with_suffix(".json"), json.dumps(meta, indent=2).encode() + b"\n")
    return EngineBuildResult(engine_path, True, seconds, key)


def resolve_model(name_or_path: str | Path, *, models_dir: Path | None = None,
                  offline: bool = False) -> Path:
    """An ONNX path as given, or the verified file of a zoo model name (never downloaded here)."""
    p = Path(name_or_path)
    if p.suffix.lower() == ".onnx" or p.exists():
        if not p.is_file():
            raise ModelMissingError(f"ONNX file '{p}' does not exist")
        return p
    try:
        from .download import ModelStore
        from .zoo import get_spec
    except ImportError:
        raise ModelMissingError(f"'{name_or_path}' is not an ONNX file, and this build has no model "
                                "zoo to look the name up in") from None
    get_spec(str(name_or_path))  # unknown names: an error listing the known ones
    return ModelStore(models_dir, offline=offline).path(str(name_or_path))


# ------------------------------------------------------------------------------------------ runner

@dataclass
class _Slot:
    """Fixed I/O buffers of one batch size on one stream, and the CUDA graph that reads and writes them."""

    batch: int
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    graph: Any = None
    graph_error: str | None = None


@dataclass
class _StreamState:
    """The execution context of one CUDA stream (IExecutionContext is not safe to share between
    streams) and its slots."""

    stream: Any
    context: Any
    slots: dict[int, _Slot] = field(default_factory=dict)
    bound_batch: int | None = None
    """Batch size whose shapes and addresses the context holds now."""


class TensorRTRunner(Runner):
    """Runs an ONNX model as a cached TensorRT engine on CuPy device arrays.

    `infer(feed, stream)` takes CuPy arrays (anything with `__cuda_array_interface__` is wrapped
    without a copy) and a CuPy stream (None: CuPy's current stream). The returned arrays are views of
    fixed output buffers of that stream and batch size: the next call on the same stream with the same
    batch size overwrites them, so copy what must live longer. Work is queued on the stream; the
    outputs are ready once it reaches them. Drive one stream from one thread at a time.

    Pass a non-default stream: CUDA graphs cannot capture the legacy default stream, and TensorRT
    synchronises the device when enqueued on it (execute_async_v3 docstring, TensorRT 11).
    """

    name = "tensorrt"
    wants_device_arrays = True

    def __init__(self, onnx_path: str | Path, *, cache_dir: str | Path | None = None,
                 precision: Precision = "fp16", max_batch: int = 4, use_cuda_graphs: bool = True,
                 progress: Progress | None = None) -> None:
        super().__init__()
        if precision not in ("fp16", "fp32"):
            raise ValueError(f"precision must be 'fp16' or 'fp32', got {precision!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.onnx_path = Path(onnx_path)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_engine_cache_dir()
        self.precision: Precision = precision
        self.max_batch = max_batch
        self.use_cuda_graphs = use_cuda_graphs
        self.progress = progress
        self.engine_path: Path | None = None
        self.engine_built = False
        """Whether activation built the engine (False: it came from the cache)."""
        self.batch_range: tuple[int, int] = (1, 1)
        """Batch sizes the engine accepts (its optimisation profile)."""
        self.graph_captures = 0
        self.graph_failures = 0
        self._engine: Any = None
        self._runtime: Any = None
        self._device_id = 0
        self._states: dict[int, _StreamState] = {}
        self._lock = threading.Lock()
        self._said: set[str] = set()

    # -- loading ------------------------------------------------------------------------------

    def _say_once(self, key: str, level: int, msg: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, msg, *args)

    def _activate_impl(self) -> None:
        trt = _require_tensorrt()  # first: it also says, in one line, when CuPy or the GPU is missing
        import cupy

        self._device_id = cupy.cuda.runtime.getDevice()
        progress = self.progress
        if progress is None:
            def progress(msg: str) -> None:
                log.info("%s: %s", self.onnx_path.name, msg)

        def load(force: bool) -> Any:
            result = ensure_engine(self.onnx_path, cache_dir=self.cache_dir, precision=self.precision,
                                   max_batch=self.max_batch, progress=progress, force=force)
            self.engine_path, self.engine_built = result.path, result.built
            if result.built:
                log.info("built TensorRT engine %s in %.0f s", result.path.name, result.seconds)
            # The runtime must outlive the engine: kept on self until deactivation.
            self._runtime = trt.Runtime(_trt_logger())
            return self._runtime.deserialize_cuda_engine(result.path.read_bytes())

        log.debug("TensorRT engine cache: %s", self.cache_dir)
        engine = load(force=False)
        if engine is None and not self.engine_built:
            # A damaged or foreign file under a matching key: rebuild once rather than fail.
            log.warning("cached engine %s does not load; rebuilding it", self.engine_path)
            engine = load(force=True)
        if engine is None:
            raise RunnerError(f"TensorRT cannot deserialize the engine it just built ({self.engine_path})")
        self._engine = engine
        self._read_io(trt)
        if not self.use_cuda_graphs:
            self._say_once("graphs-off", logging.INFO, "tensorrt: CUDA graphs off (use_cuda_graphs=False)")

    def _read_io(self, trt: Any) -> None:
        """TensorSpecs from the engine's named I/O tensors (num_io_tensors / get_tensor_name /
        get_tensor_mode / get_tensor_dtype / get_tensor_shape, as in NVIDIA's common_runtime.py)."""
        engine = self._engine
        inputs, outputs = [], []
        lows, highs = [], []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            try:
                dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            except TypeError:
                raise RunnerError(f"tensorrt: I/O tensor '{name}' has type {engine.get_tensor_dtype(name)}, "
                                  "which has no NumPy equivalent") from None
            shape = tuple(int(d) for d in engine.get_tensor_shape(name))
            dims = tuple(("batch" if k == 0 else None) if d < 0 else d for k, d in enumerate(shape))
            spec = TensorSpec(name, dims, dtype)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                inputs.append(spec)
                if shape and shape[0] < 0:
                    lo, _opt, hi = engine.get_tensor_profile_shape(name, 0)
                    lows.append(int(lo[0]))
                    highs.append(int(hi[0]))
                elif shape:
                    lows.append(shape[0])
                    highs.append(shape[0])
            else:
                outputs.append(spec)
        self.inputs, self.outputs = inputs, outputs
        self.batch_range = (max(lows, default=1), min(highs, default=1))

    def _deactivate_impl(self) -> None:
        with self._lock:
            states, self._states = self._states, {}
        for state in states.values():
            try:
                state.stream.synchronize()  # queued work still reads and writes these buffers
            except Exception as exc:
                log.warning("tensorrt: synchronising a stream at shutdown failed: %s", exc)
            state.slots.clear()
            state.context = None
        # Contexts before the engine, the engine before its runtime.
        self._engine = None
        self._runtime = None

    # -- running ------------------------------------------------------------------------------

    def _device_array(self, name: str, a: Any) -> Any:
        import cupy

        arr = as_device_array(name, a, cupy)
        if arr.device.id != self._device_id:
            raise FeedError(f"tensorrt: input '{name}' is on GPU {arr.device.id}, but the engine was "
                            f"loaded on GPU {self._device_id}")
        return arr

    def _stream(self, stream: Any) -> Any:
        import cupy

        if stream is None:
            return cupy.cuda.get_current_stream()
        if hasattr(stream, "ptr"):
            return stream
        if hasattr(stream, "__cuda_stream__") and hasattr(cupy.cuda.Stream, "from_external"):
            # CuPy 14 deprecates ExternalStream in favour of the CUDA stream protocol.
            return cupy.cuda.Stream.from_external(stream)
        if isinstance(stream, int):
            return cupy.cuda.ExternalStream(stream, self._device_id)
        if hasattr(stream, "cuda_stream"):  # a torch.cuda.Stream
            return cupy.cuda.ExternalStream(int(stream.cuda_stream), self._device_id)
        raise TypeError(f"tensorrt: stream must be a CuPy stream, a raw handle or None, got "
                        f"{type(stream).__name__}")

    def _state(self, s: Any) -> _StreamState:
        key = int(s.ptr)
        with self._lock:
            state = self._states.get(key)
            if state is None:
                # Contexts share optimisation profile 0: allowed since TensorRT 10, where profile
                # sharing (PreviewFeature.PROFILE_SHARING_0806) is always on.
                ctx = self._engine.create_execution_context()
                if ctx is None:
                    raise RunnerError("tensorrt: could not create an execution context (out of GPU memory?)")
                state = self._states[key] = _StreamState(stream=s, context=ctx)
                if key == 0:
                    self._say_once("legacy-stream", logging.WARNING,
                                   "tensorrt: running on the legacy default stream: CUDA graphs are off "
                                   "and TensorRT synchronises the device; pass a cupy.cuda.Stream()")
        return state

    def _slot(self, state: _StreamState, batch: int) -> _Slot:
        import cupy

        slot = state.slots.get(batch)
        if slot is not None:
            return slot
        # Allocated once and kept: a captured graph holds these addresses. CuPy's pool aligns
        # allocations to 512 bytes, above the 256 that TensorRT asks of I/O buffers.
        ins = {s.name: cupy.empty((batch, *s.shape[1:]), dtype=s.dtype) for s in self.inputs}
        ctx = state.context
        for s in self.inputs:
            if ctx.set_input_shape(s.name, ins[s.name].shape) is False:
                raise RunnerError(f"tensorrt: batch {batch} is outside the engine's profile for '{s.name}'")
        state.bound_batch = None  # shapes changed; addresses are bound below or on use
        outs = {}
        for s in self.outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(s.name))
            if any(d < 0 for d in shape):
                raise RunnerError(f"tensorrt: output '{s.name}' has a data-dependent shape {shape}, which "
                                  "this runner does not support")
            outs[s.name] = cupy.empty(shape, dtype=s.dtype)
        slot = state.slots[batch] = _Slot(batch, ins, outs)
        return slot

    @staticmethod
    def _bind(state: _StreamState, slot: _Slot) -> None:
        """Point the context at this slot's shapes and buffers. Done before eager runs and before
        replaying a graph, so that the context always holds the state its graph was captured with
        (the pattern of TensorRT-Edge-LLM's EngineExecutor: prepare, then replay or enqueue)."""
        if state.bound_batch == slot.batch:
            return
        ctx = state.context
        for name, arr in slot.inputs.items():
            if ctx.set_input_shape(name, arr.shape) is False:
                raise RunnerError(f"tensorrt: set_input_shape('{name}', {arr.shape}) failed")
        for name, arr in (*slot.inputs.items(), *slot.outputs.items()):
            if ctx.set_tensor_address(name, arr.data.ptr) is False:
                raise RunnerError(f"tensorrt: set_tensor_address('{name}') failed")
        state.bound_batch = slot.batch

    def _enqueue(self, state: _StreamState, s: Any) -> None:
        if not state.context.execute_async_v3(s.ptr):
            raise RunnerError("tensorrt: execute_async_v3 failed (see the TensorRT log; run with -v)")

    def _capture(self, state: _StreamState, slot: _Slot, s: Any) -> None:
        """Capture this slot's graph right after a normal run, as trtexec does: "Avoid capturing
        initialization calls by executing the enqueue function at least once before starting CUDA graph
        capture" (samples/common/sampleInference.cpp). An engine whose enqueue is not capturable makes
        the capture fail; the slot then stays eager and the reason is logged once."""
        try:
            s.synchronize()
            s.begin_capture()
            ok = False
            try:
                ok = state.context.execute_async_v3(s.ptr)
            finally:
                graph = s.end_capture()  # ends the capture even when the enqueue raised
            if not ok:
                raise RuntimeError("execute_async_v3 returned False while capturing")
            slot.graph = graph
            self.graph_captures += 1
        except Exception as exc:
            with contextlib.suppress(Exception):
                if s.is_capturing():
                    s.end_capture()
            slot.graph_error = (str(exc).splitlines() or [type(exc).__name__])[0]
            self.graph_failures += 1
            self._say_once("capture-failed", logging.WARNING,
                           "tensorrt: CUDA graph capture failed (%s); running with execute_async_v3",
                           slot.graph_error)

    def _infer_impl(self, feed: dict[str, Any], stream: Any) -> dict[str, Any]:
        import cupy

        arrays = {name: self._device_array(name, a) for name, a in feed.items()}
        batch = int(next(iter(arrays.values())).shape[0]) if arrays else 1
        lo, hi = self.batch_range
        if not lo <= batch <= hi:
            raise FeedError(f"tensorrt: batch {batch} is outside the engine's range {lo}-{hi} "
                            f"(built with max_batch={self.max_batch}); split the batch")
        with cupy.cuda.Device(self._device_id):
            s = self._stream(stream)
            state = self._state(s)
            slot = self._slot(state, batch)
            with s:  # the copies are queued on `s`, ahead of the graph or enqueue that reads them
                for name, arr in arrays.items():
                    cupy.copyto(slot.inputs[name], arr)
            self._bind(state, slot)
            if slot.graph is not None:
                slot.graph.launch(stream=s)
            else:
                self._enqueue(state, s)
                if self.use_cuda_graphs and slot.graph_error is None and int(s.ptr) != 0:
                    self._capture(state, slot, s)
        return dict(slot.outputs)


# ------------------------------------------------------------------------------ start-up self-check

SELF_CHECK_REL_TOL: dict[str, float] = {"fp32": 5e-3, "fp16": 1e-2}
"""Largest relative L2 error the self-check accepts. fp32 builds use TF32 by default (a 10-bit
mantissa: ~1e-3 relative); fp16 carries 11 significant bits, a few layers of rounding stay well
under 1e-2. A wrong engine (a bad kernel, a broken install, garbage memory) is off by order 1."""


def outputs_agree(got: np.ndarray, want: np.ndarray, *, rel_tol: float) -> tuple[bool, str]:
    """(agree, why): whether `got` matches the reference `want`: the same shape, every value finite,
    and the relative L2 error ||got - want|| / ||want|| at most `rel_tol` (against an all-zero
    reference, the absolute L2 norm of `got`)."""
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return False, f"output shape {g.shape} where the reference has {w.shape}"
    bad = int(np.count_nonzero(~np.isfinite(g)))
    if bad:
        return False, f"{bad} of {g.size} output values are not finite"
    ref = float(np.linalg.norm(w))
    err = float(np.linalg.norm(g - w)) / (ref if ref > 0 else 1.0)
    if not err <= rel_tol:
        return False, f"relative error {err:.2g} against the reference, over the {rel_tol:g} allowed"
    return True, f"relative error {err:.2g} (at most {rel_tol:g})"


def self_check_case() -> tuple[bytes, np.ndarray, np.ndarray]:
    """(ONNX model, input, ONNX Runtime's output) of the start-up self-check: a 3x3 convolution,
    ReLU, a 1x1 convolution and a sigmoid on one 3x32x32 image, fixed weights and input (seed 0),
    run on the CPU by ONNX Runtime as the reference."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
             for name, shape in (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (3, 8, 1, 1)), ("b2", (3,)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
         helper.make_node("Sigmoid", ["c2"], ["y"])],
        "swapstream_self_check",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return data, x, session.run(None, {"x": x})[0]


@functools.cache
def tensorrt_self_check(precision: Precision = "fp16") -> tuple[bool, str]:
    """(passed, why): TensorRT is available, builds an engine of `self_check_case`'s model at
    `precision`, and that engine's output, eager and replayed from its CUDA graph, agrees with ONNX
    Runtime's (`outputs_agree`). `neural.runner=auto` takes TensorRT only when this passes: the
    runner is written to TensorRT's documented API but has never run on a real TensorRT here.

    Run once per process and remembered (functools.cache): the installed TensorRT and GPU do not
    change under a running process, and the first check builds an engine (seconds). The engine is
    cached like any other (`default_engine_cache_dir`), so later starts only load and run it."""
    ok, why = tensorrt_available()
    if not ok:
        return False, why
    fail = "TensorRT failed its start-up self-check"
    try:
        import cupy

        data, x, want = self_check_case()
        folder = default_engine_cache_dir() / "self_check"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "self_check.onnx"
        if not path.is_file() or path.read_bytes() != data:
            _write_atomic(path, data)
        stream = cupy.cuda.Stream(non_blocking=True)
        with TensorRTRunner(path, cache_dir=folder, precision=precision, max_batch=1,
                            progress=lambda msg: log.debug("self-check: %s", msg)) as runner:
            for attempt in ("eager", "CUDA graph"):  # the first call runs eagerly and captures
                out = runner.infer({"x": cupy.asarray(x)}, stream)
                stream.synchronize()
                got = cupy.asnumpy(next(iter(out.values())))
                agree, detail = outputs_agree(got, want, rel_tol=SELF_CHECK_REL_TOL[precision])
                if not agree:
                    return False, f"{fail} ({precision}, {attempt} run): {detail}"
    except Exception as exc:  # any failure of a TensorRT that cannot be trusted is a reason not to use it
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return False, f"{fail} ({precision}): {type(exc).__name__}: {first}"
    return True, f"{why}; {precision} self-check passed ({detail})"


def as_device_array(name: str, a: Any, cupy: Any) -> Any:
    """`a` as a CuPy array without copying, or a FeedError saying how to get it onto the GPU."""
    mod = array_module_name(a)
    if mod == "cupy":
        return a
    if hasattr(a, "__cuda_array_interface__"):  # torch CUDA tensors, Numba arrays: zero-copy views
        return cupy.asarray(a)
    where = "in host memory" if mod in ("numpy", "torch", "builtins") else f"a {type(a).__name__}"
    raise FeedError(f"tensorrt: input '{name}' is a {mod} array {where}; the TensorRT runner reads "
                    "device memory only. Move it to the GPU first (cupy.asarray(x)) or use the "
                    "onnxruntime runner for host arrays")


__all__ = ["EngineBuildResult", "EngineCacheKey", "TensorRTRunner", "build_engine",
           "convert_onnx_to_fp16", "default_engine_cache_dir", "engine_cache_path", "ensure_engine",
           "gpu_identity", "make_engine_cache_key", "norm_statistics_nodes", "outputs_agree",
           "resolve_model", "self_check_case", "tensorrt_available", "tensorrt_self_check",
           "timing_cache_path"]
