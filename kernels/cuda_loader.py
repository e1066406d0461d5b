"""Load the CUDA C sources in `kernels/cuda/` as CuPy `RawModule`s.

Following cupyx.scipy.ndimage: a loader prepends `#define`s to the source, builds the module with
NVRTC, and memoizes it per device, keyed on every parameter that changes the code. Kernel names carry
those parameters as a suffix (`nv12_to_rgb_u8`), so a profiler shows which variant ran.

Compiled modules are immutable, so sharing them across pipelines in one process is safe.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ._xp import check_array

CUDA_DIR = Path(__file__).resolve().parent / "cuda"

# -std=c++17 for constexpr and templates in the sources; fast math is off on purpose: the kernels
# must match their NumPy references to documented tolerances, and --use_fast_math changes division
# and exp/pow results by several ulps.
_NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)


def _build(source: str, key_defs: tuple[tuple[str, str], ...]) -> Any:
    import cupy

    head = "".join(f"#define {k} {v}\n" for k, v in key_defs)
    code = head + (CUDA_DIR / source).read_text()
    return cupy.RawModule(code=code, options=_NVRTC_OPTIONS)


@functools.cache
def _builder() -> Any:
    # Built lazily because CuPy is optional; the memo itself is CuPy's (`cupy.memoize`, per device,
    # as cupyx.scipy.ndimage uses), holding compiled modules, which are immutable.
    import cupy

    return cupy.memoize(for_each_device=True)(_build)


def _key_defs(defines: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """The defines as a hashable key, in a fixed order (the same code for the same defines)."""
    return tuple(sorted((k, str(v)) for k, v in defines.items())) if defines else ()


def load_module(source: str, defines: dict[str, Any] | None = None) -> Any:
    """The `RawModule` for `kernels/cuda/<source>` with `defines`, compiled once per device and
    keyed on the source name and every define."""
    return _builder()(source, _key_defs(defines))


def kernel(source: str, name: str, defines: dict[str, Any] | None = None) -> Any:
    """One kernel function from `load_module(source, defines)`, looked up once per device."""
    import cupy

    return _function(cupy.cuda.runtime.getDevice(), source, name, _key_defs(defines))


@functools.cache
def _function(device: int, source: str, name: str, key_defs: tuple[tuple[str, str], ...]) -> Any:
    # A launch looked its function up through the module memo and RawModule.get_function each
    # time, 10-15 us of host time per launch under cProfile (docs/performance.md, many streams).
    # Functions are immutable; `device` is in the key because modules are per device.
    return _builder()(source, key_defs).get_function(name)


def require_cupy(name: str, a: Any, *, ndim: int | None = None, dtype: Any = None,
                 shape: tuple[int | None, ...] | None = None) -> None:
    """Check that `a` is a C-contiguous CuPy array on the current device, with the given layout."""
    if not type(a).__module__.startswith("cupy"):
        raise ValueError(f"{name} must be a CuPy array on the GPU, got {type(a).__name__}")
    import cupy

    if a.device.id != cupy.cuda.runtime.getDevice():
        raise ValueError(f"{name} is on GPU {a.device.id}, but the current device is "
                         f"{cupy.cuda.runtime.getDevice()}")
    check_array(name, a, ndim=ndim, dtype=dtype, shape=shape)
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass cupy.ascontiguousarray({name})")


def grid(n: int, block: int = 256) -> tuple[int]:
    return ((n + block - 1) // block,)
