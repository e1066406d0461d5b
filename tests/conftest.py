"""Repository-wide test fixtures."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def cp() -> ModuleType:
    """CuPy with a usable CUDA device, or skip: GPU tests skip cleanly on CPU-only machines (CI)."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except Exception as exc:  # CUDA driver missing or broken: a skip, not an error, on CPU hosts
        pytest.skip(f"CUDA unavailable: {exc}")
    return cupy
