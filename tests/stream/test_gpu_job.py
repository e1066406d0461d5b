"""The GPU file job against the CPU one on the demo clip, and its memory over a longer run (`-m gpu`)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

av = pytest.importorskip("av")  # the GPU machine needs PyAV carried as a wheel for this file

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, write_demo_clip  # noqa: E402
from swapstream.pipeline import FileJob  # noqa: E402

pytestmark = pytest.mark.gpu


def decode(path: Path) -> tuple[list[np.ndarray], list[int]]:
    frames, pts = [], []
    with av.open(str(path)) as c:
        for f in c.decode(video=0):
            frames.append(f.to_ndarray(format="rgb24"))
            pts.append(int(f.pts))
    return frames, pts


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def run_job(cls: type, clip: Path, out: Path, progress=None) -> object:
    job = cls(load_config())
    try:
        job.set_source_image(astronaut(), "astronaut")
        return job.run(clip, out, progress=progress)
    finally:
        job.close()


def test_gpu_job_matches_cpu_job(cp: ModuleType, tmp_path: Path) -> None:
    from swapstream.gpu.job import GpuFileJob

    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    s_cpu = run_job(FileJob, clip, tmp_path / "cpu.mp4")
    s_gpu = run_job(GpuFileJob, clip, tmp_path / "gpu.mp4")
    assert s_cpu.frames == s_gpu.frames == 20 and s_gpu.faces_swapped == 20
    a, pa = decode(tmp_path / "cpu.mp4")
    b, pb = decode(tmp_path / "gpu.mp4")
    src, ps = decode(clip)
    assert pa == pb == ps  # frame count and every timestamp, in order
    worst = min(psnr(x, y) for x, y in zip(a, b))
    print(f"GPU vs CPU job, worst frame PSNR {worst:.1f} dB")
    assert worst >= 40.0
    # And the swap did happen: the outputs are far from the input in the face.
    assert min(psnr(x, y) for x, y in zip(b, src)) < 35.0


def test_gpu_job_memory_stays_flat(cp: ModuleType, tmp_path: Path) -> None:
    from swapstream.gpu.job import GpuFileJob

    clip = tmp_path / "long.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=12.0, fps=25, size=(640, 360))
    pool = cp.get_default_memory_pool()
    gpu, host = [], []

    def sample(done: int, _total: int) -> None:
        if done % 10 == 0:
            gpu.append(pool.used_bytes() + pool.total_bytes())
            with open("/proc/self/statm") as f:
                host.append(int(f.read().split()[1]) * 4096)

    stats = run_job(GpuFileJob, clip, tmp_path / "out.mp4", sample)
    assert stats.frames == 300
    g, h = np.array(gpu[5:]), np.array(host[5:])  # after warm-up
    print(f"GPU pool {g.min() >> 20}-{g.max() >> 20} MiB, host RSS {h.min() >> 20}-{h.max() >> 20} MiB")
    assert g.max() - g.min() <= 2 << 20
    assert h.max() - h.min() <= 32 << 20
