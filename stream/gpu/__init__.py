"""The GPU-resident pipeline: frames in GPU memory from upload to download, double-buffered."""


def gpu_available() -> tuple[bool, str]:
    """Whether the GPU path can run here, and why (or why not)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install 'swapstream[gpu]')"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or a broken one
        return False, f"CUDA is not usable: {str(e).splitlines()[0]}"
    if n == 0:
        return False, "no CUDA device"
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return True, f"CuPy {cupy.__version__} on {name}"
