"""Pick a runner: TensorRT (once its start-up self-check passes), then PyTorch on CUDA, then ONNX
Runtime, and say why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from .runner import Runner

log = logging.getLogger(__name__)

RunnerName = Literal["auto", "tensorrt", "torch", "onnxruntime"]


def torch_cuda_available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return False, "PyTorch sees no CUDA device"
    return True, f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}"


def choose_runner(preference: RunnerName = "auto", *, precision: str = "auto") -> tuple[str, str]:
    """(runner name, reason). `auto` takes the first of tensorrt, torch, onnxruntime that works;
    TensorRT only once its start-up self-check has passed (`tensorrt_self_check`: an engine built
    here, its output compared with ONNX Runtime's) at the precision the runner would use. A
    TensorRT that is installed but fails the check is logged as a warning with the reason."""
    if preference != "auto":
        return preference, "asked for in the configuration"
    try:
        from .tensorrt_runner import tensorrt_available, tensorrt_self_check

        ok, why = tensorrt_available()
        if ok:
            ok, why = tensorrt_self_check("fp32" if precision == "fp32" else "fp16")
            if not ok:
                log.warning("neural.runner=auto: not using TensorRT: %s", why)
    except ImportError:
        ok, why = False, "the TensorRT runner is not part of this build"
    if ok:
        return "tensorrt", why
    ok_t, why_t = torch_cuda_available()
    if ok_t:
        return "torch", f"TensorRT unavailable ({why}); {why_t}"
    return "onnxruntime", f"TensorRT unavailable ({why}); {why_t}; ONNX Runtime runs on the CPU"


def make_runner(model: str | Path, preference: RunnerName = "auto", *,
                precision: str = "auto", compile: bool = False) -> Runner:
    """A runner for the ONNX file `model`, chosen by `choose_runner`; the choice is logged.

    PyTorch runs only architectures that have a native module (see torch_models); under `auto`, any
    other model goes to ONNX Runtime, which uses its CUDA provider where one is installed.
    """
    name, why = choose_runner(preference, precision=precision)
    loaded: Any = None
    if name == "torch" and preference == "auto":
        import onnx

        from .native import native_for
        from .torch_models import onnx_initializers

        loaded = onnx.load(str(model))
        inits = onnx_initializers(loaded)
        if native_for(inits) is None:
            name, why = "onnxruntime", "no native PyTorch module for this architecture"
            loaded = None
    log.info("runner for %s: %s (%s)", Path(str(model)).name, name, why)
    if name == "tensorrt":
        from .tensorrt_runner import TensorRTRunner

        return TensorRTRunner(model, precision="fp32" if precision == "fp32" else "fp16")
    if name == "torch":
        from .torch_runner import TorchRunner

        return TorchRunner(loaded if loaded is not None else model, precision=precision,  # type: ignore[arg-type]
                           compile=compile)
    from .ort_runner import OnnxRuntimeRunner

    return OnnxRuntimeRunner(model)
