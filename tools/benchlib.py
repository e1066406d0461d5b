"""What every benchmark tool records about its run (imported by the tools in this folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def git_sha() -> str:
    """The commit the numbers belong to: $GIT_SHA when set (the GPU machine's copy of the tree may
    carry a stale .git, so tools/device_check.sh runs get it from the dev machine), else git's HEAD."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    """This machine's CPU, as benchmark records name a CPU device."""
    import platform

    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def gpu_name() -> str:
    """GPU 0's name from nvidia-smi (so that a parent process needs no CUDA context of its own)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.splitlines()[0].strip() or "unknown GPU"
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU"


def device_name() -> str:
    """The device a benchmark of this process ran on: GPU 0's name (NVML), else `cpu_name()`."""
    from swapstream.runtime.metrics import GpuMonitor

    gpu = GpuMonitor()
    try:
        samples = gpu.sample()
    finally:
        gpu.close()
    return samples[0].name if samples else cpu_name()


def run_fields(device: str, command: str) -> dict[str, str]:
    """The fields every benchmark record carries: where, which commit, when, and the command."""
    import datetime as dt

    return {"device": device, "commit": git_sha(), "date": dt.date.today().isoformat(), "command": command}


def batch_sizes(text: str, most: int) -> list[int]:
    """`--batches` (whole numbers joined by commas, each 1..most), sorted and unique; a bad value
    exits with an error that names the option."""
    try:
        batches = sorted({int(b) for b in text.split(",")})
    except ValueError:
        sys.exit(f"error: --batches takes whole numbers joined by commas, got {text!r}")
    if not batches or min(batches) < 1 or max(batches) > most:
        sys.exit(f"error: --batches must be between 1 and {most}, got {text!r}")
    return batches


def median_ms(cp: Any, fn: Callable[[], Any], stream: Any, reps: int = 50, warm: int = 10) -> float:
    """Median time of `fn` between CUDA events recorded on `stream` (CuPy's), in milliseconds,
    after `warm` untimed calls. `fn` must queue its work on `stream` (or on the legacy default
    stream when `stream` is CuPy's null stream, as torch does by default)."""
    import numpy as np

    for _ in range(warm):
        fn()
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def wall_median_ms(fn: Callable[[], Any], reps: int = 20, warm: int = 2) -> float:
    """Median wall time of `fn` in milliseconds, after `warm` untimed calls (host-side work)."""
    import time

    import numpy as np

    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def package_links(tree: Path, folder: Path, env: dict[str, str]) -> None:
    """Lay out another revision's `swapstream` package in `folder` as links into `tree` (a checkout,
    or `git archive REV stream kernels engines configs` unpacked): stream/'s entries, plus kernels/
    and engines/ as the subpackages pyproject.toml maps them to; the tree is left as it is. Modules
    resolve their own paths (configs/, assets/) through the links, so they find the tree's files.
    `env` is the environment that puts `folder` first on PYTHONPATH: the package it imports is
    checked to be the tree's (a stale install or path would time the wrong code)."""
    tree = tree.resolve()
    missing = [p for p in ("stream/cli.py", "kernels", "engines", "configs") if not (tree / p).exists()]
    if missing:
        # configs/ too: the presets (`-c live`) are found beside the package (config.PRESETS_DIR).
        raise SystemExit(f"error: {tree} lacks {', '.join(missing)}: give a checkout of another revision, "
                         "or `git archive REV stream kernels engines configs` unpacked")
    pkg = folder / "swapstream"
    pkg.mkdir(parents=True)
    for entry in (tree / "stream").iterdir():
        if entry.name not in ("__pycache__", "kernels", "engines"):
            pkg.joinpath(entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for sub in ("kernels", "engines"):
        pkg.joinpath(sub).symlink_to(tree / sub, target_is_directory=True)
    where = subprocess.run([sys.executable, "-c", "import swapstream.cli, swapstream.kernels.mesh as m; "
                            "print(m.__file__)"], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree):
        raise SystemExit(f"error: the baseline imports swapstream from {where}, not from {tree}")


def source_image(folder: Path) -> Path:
    """The built-in astronaut portrait (public domain, with a built-in consent record) written into
    `folder` as the `-s` picture of a timed `swapstream run`."""
    import cv2

    from swapstream.demo import astronaut

    path = folder / "astronaut.png"
    cv2.imwrite(str(path), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    return path


def set_flags(sets: list[str]) -> list[str]:
    """`--set KEY=VALUE` for each override, as `swapstream run` takes them."""
    return [x for v in sets for x in ("--set", v)]


def wait_ready(base: str, proc: Any, timeout: float) -> float:
    """Seconds until `swapstream serve` at `base` answers /readyz with 200 (every worker started,
    its networks compiled: minutes on a cold GPU); RuntimeError when its process `proc` exits first
    or `timeout` passes."""
    import time
    import urllib.error
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"swapstream serve exited with code {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (OSError, urllib.error.URLError):
            pass  # not listening yet, or 503 while it starts
        time.sleep(0.25)
    raise RuntimeError(f"swapstream serve was not ready after {timeout:.0f} s")


def interrupt(proc: Any, timeout: float = 60.0) -> int:
    """Stop a `swapstream` command as a user does, with Ctrl+C (SIGINT): its exit code once it has
    finished (its summary, its outputs closed); killed after `timeout`."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return int(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        return int(proc.wait())

