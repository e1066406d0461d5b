"""`swapstream run`'s stream on the GPU against the same on the CPU, on the demo clip, and its memory
over a longer run (`-m gpu`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

av = pytest.importorskip("av")  # the GPU machine needs PyAV carried as a wheel for this file

from swapstream.config import load_config  # noqa: E402
from swapstream.demo import astronaut, grace_hopper, write_demo_clip  # noqa: E402
from swapstream.runtime.manager import default_backend_factory  # noqa: E402
from swapstream.runtime.run import RunJob  # noqa: E402

from .measures import psnr  # noqa: E402

pytestmark = pytest.mark.gpu


def decode(path: Path) -> tuple[list[np.ndarray], list[int]]:
    frames, pts = [], []
    with av.open(str(path)) as c:
        for f in c.decode(video=0):
            frames.append(f.to_ndarray(format="rgb24"))
            pts.append(int(f.pts))
    return frames, pts


# Both jobs must carry the same watermark payload (the stream id is random per run otherwise), so
# that the comparison sees the same mark on both sides.
SAME_MARK = ["watermark.stream_id=4242"]


CPU, GPU = "cpu", "cuda:0"


def run_job(device: str, clip: Path, out: Path | str, progress=None, overrides: list[str] | None = None,
            check: Callable[[Any], None] | None = None) -> Any:
    """One run with the astronaut's face on `device`; `check` looks at each swap backend the
    runtime builds."""
    def backends(name: str, cfg: Any, dev: str) -> Any:
        b = default_backend_factory(name, cfg, dev)
        if check is not None:
            check(b)
        return b

    job = RunJob(load_config(None, SAME_MARK + (overrides or [])), device=device, backend_factory=backends)
    try:
        job.set_source_image(astronaut(), "astronaut")
        return job.run(clip, out, progress=progress)
    finally:
        job.close()


def worst_psnr(a: list[np.ndarray], b: list[np.ndarray], what: str) -> float:
    """The worst frame's PSNR; prints every frame's and where the worst one differs (a failure then
    says whether one region, one frame or every frame is off)."""
    values = [psnr(x, y) for x, y in zip(a, b)]
    i = int(np.argmin(values))
    diff = np.abs(a[i].astype(np.int16) - b[i]).max(axis=2)
    ys, xs = np.nonzero(diff > 8)
    where = f"x {xs.min()}-{xs.max()}, y {ys.min()}-{ys.max()}, {len(xs)} px" if len(xs) else "none"
    print(f"{what}: per frame PSNR {[round(v, 1) for v in values]}; worst frame {i}: max diff "
          f"{int(diff.max())}, pixels off by more than 8: {where}")
    return values[i]


def assert_same_frames(x: Any, y: Any, paths: tuple[Path, Path], what: str, min_db: float) -> None:
    """Two runs of the 20-frame demo clip (their summaries `x`, `y` and outputs `paths`): every
    frame's face swapped in both, the same timestamps in order, and each frame at `min_db` or more
    of the other's (the caller says why that tolerance)."""
    assert x.frames == y.frames == 20 and x.faces_swapped == y.faces_swapped == 20
    a, pa = decode(paths[0])
    b, pb = decode(paths[1])
    assert pa == pb
    assert worst_psnr(a, b, what) >= min_db


def test_gpu_job_matches_cpu_job(cp: ModuleType, tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    s_cpu = run_job(CPU, clip, tmp_path / "cpu.mp4")
    # Both decode with PyAV: with NVDEC (the GPU job's default where PyNvVideoCodec is installed)
    # the pictures differ from swscale's by a level or two before any swap (36-38 dB on the H200,
    # test_gpu_job_decodes_on_nvdec_like_pyav), which would hide what this compares: the swap.
    s_gpu = run_job(GPU, clip, tmp_path / "gpu.mp4", overrides=["decoder=cpu"])
    assert s_cpu.frames == s_gpu.frames == 20 and s_gpu.faces_swapped == 20
    a, pa = decode(tmp_path / "cpu.mp4")
    b, pb = decode(tmp_path / "gpu.mp4")
    src, ps = decode(clip)
    assert pa == pb == ps  # frame count and every timestamp, in order
    worst = worst_psnr(a, b, "GPU vs CPU job")
    assert worst >= 40.0
    # And the swap did happen: the outputs are far from the input in the face.
    assert min(psnr(x, y) for x, y in zip(b, src)) < 35.0


def test_gpu_job_asking_ahead_for_faces_changes_no_frame(cp: ModuleType, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`runtime.analysis_depth=2` on the GPU: the next frame goes to the device's analysis batcher
    while one is analysed (one frame of a stream per batch, the next batch handed to the analysis
    thread while one runs); every frame comes out as with one frame at a time, in order."""
    from swapstream.runtime.gpu_stages import DeviceAnalysis
    from swapstream.runtime.manager import WARM_ID
    from swapstream.runtime.stream import StreamPipeline

    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    asked = analysed = 0
    ahead_at_end: list[int] = []  # frames asked for beyond those analysed, as each batch ends
    ask, track = StreamPipeline._ask_faces, DeviceAnalysis.track

    def counting_ask(self: StreamPipeline, w: Any) -> Any:
        nonlocal asked
        asked += 1
        return ask(self, w)

    def slow_track(self: DeviceAnalysis, items: list[Any]) -> Any:
        nonlocal analysed
        frames = sum(1 for sid, _f, _c in items if sid != WARM_ID)  # not the runtime's warm-up face
        if not frames:
            return track(self, items)
        time.sleep(0.03)  # slower than NVDEC and the swap: frames wait for the analysis
        found = track(self, items)
        analysed += frames
        ahead_at_end.append(asked - analysed)
        return found

    monkeypatch.setattr(StreamPipeline, "_ask_faces", counting_ask)
    monkeypatch.setattr(DeviceAnalysis, "track", slow_track)
    one = run_job(GPU, clip, tmp_path / "one.mp4")
    assert ahead_at_end and max(ahead_at_end) == 0, ahead_at_end  # one frame at a time
    ahead_at_end.clear()
    asked = analysed = 0
    two = run_job(GPU, clip, tmp_path / "two.mp4", overrides=["runtime.analysis_depth=2"])
    assert max(ahead_at_end) == 1 and ahead_at_end.count(1) >= 10, ahead_at_end
    # The same work on the same frames: equal but for the GPU's own run-to-run rounding (cuDNN may
    # pick another algorithm per process, a level here and there). A frame swapped with another
    # frame's faces, or out of order, is far below (the portrait moves in every frame).
    assert_same_frames(one, two, (tmp_path / "one.mp4", tmp_path / "two.mp4"), "analysis depth 2 vs 1", 45.0)


def test_gpu_job_swaps_a_files_frames_in_batches_like_one_at_a_time(cp: ModuleType, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`runtime.file_batch` on the GPU: a file's analysed frames reach the swap `neural.max_batch` at a
    time (one model call for four frames' faces); every frame comes out as when each frame is swapped
    on its own, in order."""
    from swapstream.runtime.gpu_stages import DeviceAnalysis
    from swapstream.runtime.manager import WARM_ID, DeviceSlot

    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    sizes: list[int] = []
    run, track = DeviceSlot._run, DeviceAnalysis.track

    def counting_run(self: DeviceSlot, key: Any, items: list[Any]) -> Any:
        if all(it.stream_id != WARM_ID for it in items):
            sizes.append(len(items))
        return run(self, key, items)

    def slow_track(self: DeviceAnalysis, items: list[Any]) -> Any:
        if any(sid != WARM_ID for sid, _f, _c in items):
            time.sleep(0.02)  # the analysis as the slow stage, as in `run` on the H200
        return track(self, items)

    monkeypatch.setattr(DeviceSlot, "_run", counting_run)
    monkeypatch.setattr(DeviceAnalysis, "track", slow_track)
    single = run_job(GPU, clip, tmp_path / "single.mp4", overrides=["runtime.file_batch=false"])
    assert sizes.count(1) > len(sizes) // 2, sizes
    sizes.clear()
    batched = run_job(GPU, clip, tmp_path / "batched.mp4", overrides=["neural.max_batch=4"])
    assert sum(sizes) == 20 and sizes.count(4) >= 3, sizes  # 20 frames: five batches of 4 at best
    # The same faces through the model at batch 4 instead of 1: cuDNN may pick other kernels for
    # another batch size (rounding, a level here and there). A frame swapped with another frame's
    # faces, or out of order, is far below (the portrait moves in every frame).
    assert_same_frames(single, batched, (tmp_path / "single.mp4", tmp_path / "batched.mp4"),
                       "file batch vs one frame at a time", 40.0)


def test_gpu_job_with_the_analysis_stream_first_changes_no_frame(cp: ModuleType, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`runtime.analysis_priority`: the analysis thread's CUDA stream has the device's highest priority
    (off: the default one), and every frame comes out as without it, in order."""
    import torch

    from swapstream.runtime.gpu_stages import DeviceAnalysis

    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    priorities: list[int] = []
    init = DeviceAnalysis.__init__

    def recording_init(self: DeviceAnalysis, config: Any) -> None:
        init(self, config)
        priorities.append(torch.cuda.ExternalStream(self.stream.ptr).priority)

    monkeypatch.setattr(DeviceAnalysis, "__init__", recording_init)
    plain = run_job(GPU, clip, tmp_path / "plain.mp4")
    first = run_job(GPU, clip, tmp_path / "first.mp4", overrides=["runtime.analysis_priority=true"])
    # The device's highest priority as CUDA gives it (torch's priority_range() caps it at -3 where
    # CUDA has -5): a stream asked for far past it is clamped to it.
    top = cp.cuda.Stream(non_blocking=True, priority=-1000)
    greatest = torch.cuda.ExternalStream(top.ptr).priority
    assert greatest < 0 and priorities == [0, greatest], (priorities, greatest)
    # The same kernels, scheduled in another order on the GPU: equal but for the GPU's run-to-run
    # rounding (a level here and there, as in the depth test). A frame swapped with another
    # frame's faces, or out of order, is far below (the portrait moves in every frame).
    assert_same_frames(plain, first, (tmp_path / "plain.mp4", tmp_path / "first.mp4"),
                       "analysis stream first vs default", 45.0)


def test_gpu_job_decodes_on_nvdec_like_pyav(cp: ModuleType, tmp_path: Path) -> None:
    """NVDEC decodes the GPU job's input straight into device memory, with PyAV's demuxer carrying the
    audio beside it: the same frames, timestamps and audio as the job that decodes with PyAV."""
    from swapstream.gpu.pynvc import nvdec_available

    ok, why = nvdec_available()
    if not ok:
        pytest.skip(why)
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    s_nv = run_job(GPU, clip, tmp_path / "nvdec.mp4", overrides=["decoder=nvdec"])
    s_av = run_job(GPU, clip, tmp_path / "pyav.mp4", overrides=["decoder=cpu"])
    assert (s_nv.decoder, s_av.decoder) == ("nvdec", "pyav")
    assert s_nv.frames == s_av.frames == 20 and s_nv.faces_swapped == 20
    assert s_nv.audio_packets == s_av.audio_packets > 0
    a, pa = decode(tmp_path / "nvdec.mp4")
    b, pb = decode(tmp_path / "pyav.mp4")
    _, ps = decode(clip)
    assert pa == pb == ps  # frame count and every timestamp, in order
    with av.open(str(tmp_path / "nvdec.mp4")) as c:
        assert len(c.streams.audio) == 1
        audio = sum(1 for p in c.demux(audio=0) if p.size)
    assert audio == s_nv.audio_packets
    # NVDEC's NV12 -> RGB (our kernel) and swscale's round differently by a level or two, and the
    # landmarks found on the two pictures differ by a fraction of a pixel: close, not equal.
    worst = worst_psnr(a, b, "NVDEC vs PyAV decode in the GPU job")
    assert worst >= 35.0
    # The null output: the same job, nothing downloaded or encoded.
    s_null = run_job(GPU, clip, "null:", overrides=["decoder=nvdec"])
    assert (s_null.frames, s_null.faces_swapped, s_null.audio_packets) == (20, 20, s_nv.audio_packets)


def test_gpu_job_memory_stays_flat(cp: ModuleType, tmp_path: Path) -> None:
    clip = tmp_path / "long.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=12.0, fps=25, size=(640, 360))
    pool = cp.get_default_memory_pool()
    gpu, host = [], []

    def sample(done: int, _total: int) -> None:
        # Called as the run polls its stream (every 20 ms), not once a frame.
        gpu.append(pool.used_bytes() + pool.total_bytes())
        with open("/proc/self/statm") as f:
            host.append(int(f.read().split()[1]) * 4096)

    stats = run_job(GPU, clip, tmp_path / "out.mp4", sample)
    assert stats.frames == 300 and len(gpu) >= 15, len(gpu)
    g, h = np.array(gpu[5:]), np.array(host[5:])  # after warm-up
    print(f"GPU pool {g.min() >> 20}-{g.max() >> 20} MiB, host RSS {h.min() >> 20}-{h.max() >> 20} MiB")
    # The lossless stream holds up to its room of frames in flight (2 * max_batch + 2), each as an
    # RGB frame, the swap's backup copy of it and its NV12 output: the pool swings by up to that
    # much as the queues fill and drain (about 6 MiB on the H200), whatever is leaked or not.
    room = 2 * load_config("default").neural.max_batch + 2
    assert g.max() - g.min() <= room * 3 * 640 * 360 * 3
    # A leak grows with the frames: anything kept per frame (a 640x360 mask is 230 KB) would put the
    # second half's median at least 150 x 230 KB = 34 MB above the first half's. A pool that settles
    # moves it by a few blocks at most.
    half = len(g) // 2
    assert np.median(g[half:]) - np.median(g[:half]) <= 4 << 20
    assert h.max() - h.min() <= 32 << 20


def test_gpu_job_matches_cpu_job_with_identity_swapper(cp: ModuleType, tmp_path: Path) -> None:
    """The neural path of the GPU job (crop, de-normalise and paste back as CUDA kernels on device
    frames) against the CPU job, with the identity model. The model itself runs in ONNX Runtime on
    the host in both jobs (the torch runner has no native module for this architecture and the
    device has no onnxruntime-gpu), so this checks the GPU job's pre- and post-processing and its
    data movement around a model, not GPU inference (test_torch_runner_gpu.py covers that)."""
    from ..zoo_models import copy_builtin, place
    from ..zoo_models import make_test_models as tm

    models = tmp_path / "models"
    models.mkdir()
    copy_builtin(models)
    place(models, "arcface_w600k_r50", tm.arcface_stub(seed=0))
    place(models, "hyperswap_1a_256", tm.identity_swapper(size=256, mean=(0.5,) * 3, std=(0.5,) * 3,
                                                          output_space="normalised"))
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=2.0, fps=10, size=(1280, 720))
    cfg = [f"models_dir={models}", "swapper=hyperswap_1a_256", "neural.download=false"]
    outs = {}
    for name, cls in (("cpu", CPU), ("gpu", GPU)):
        # PyAV decoding in both, as in test_gpu_job_matches_cpu_job.
        stats = run_job(cls, clip, tmp_path / f"{name}.mp4",
                        overrides=cfg + ["neural.runner=onnxruntime", "decoder=cpu"])
        assert stats.frames == 20 and stats.faces_swapped == 20
        outs[name] = decode(tmp_path / f"{name}.mp4")
    (a, pa), (b, pb) = outs["cpu"], outs["gpu"]
    _src, ps = decode(clip)
    assert pa == pb == ps
    worst = worst_psnr(a, b, "identity swapper: GPU vs CPU job")
    assert worst >= 40.0


@pytest.fixture(scope="module")
def stack_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A swapper and issue 23's face stack, in real architectures (random weights): a random XSeg
    occluder, a BiSeNet that calls everything skin, and the GFPGAN v1.4 architecture (about 346 MB)."""
    from ..zoo_models import stack_models as build

    return build(tmp_path_factory.mktemp("stack") / "models", parser="bisenet_all_skin")


@pytest.mark.parametrize("runner,floor", [
    # The models in ONNX Runtime on the host in both jobs: what differs is the GPU job's crops,
    # masks, enhancer warps and single paste on device frames, so the same 40 dB as above.
    ("onnxruntime", 40.0),
    # The product's GPU path (`auto`, as serve runs it): the swapper, occluder, parser and enhancer
    # in the torch runner on the GPU, the embedder (an architecture without a native module) in ONNX
    # Runtime; fp32, TF32 off: summation order alone differs from ONNX Runtime, relative 1e-4 per
    # model. The random GFPGAN's busy output turns that into level-sized differences that x264 then
    # codes differently: 35 dB.
    ("auto", 35.0),
])
def test_gpu_job_with_the_face_stack_matches_cpu_job(cp: ModuleType, stack_models: Path, tmp_path: Path,
                                                     runner: str, floor: float) -> None:
    """Issue 23's stack on device frames: occluder (random XSeg), parser (BiSeNet that calls
    everything skin) and the GFPGAN v1.4 architecture (random weights), one paste, against the CPU
    job with the same models."""
    clip = tmp_path / "clip.mp4"
    write_demo_clip(clip, grace_hopper(), seconds=1.0, fps=10, size=(1280, 720))
    cfg = [f"models_dir={stack_models}", "swapper=inswapper_128", "neural.download=false",
           "mask.types=box,occlusion,region", "enhancer=gfpgan_1.4", "decoder=cpu"]
    def on_the_gpu(backend: Any) -> None:
        sw = backend.swapper
        assert sw.masker is not None and sw.enhancer is not None
        used = [sw.runner.name, sw.masker.occluder.name, sw.masker.parser.name, sw.enhancer.runner.name]
        assert used == ["torch"] * 4, used  # the stack on the GPU, not ONNX Runtime's fallback

    outs = {}
    for name, cls, extra in (("cpu", CPU, ["neural.runner=onnxruntime"]),
                             ("gpu", GPU, [f"neural.runner={runner}", "neural.precision=fp32"])):
        stats = run_job(cls, clip, tmp_path / f"{name}.mp4", overrides=cfg + extra,
                        check=on_the_gpu if name == "gpu" and runner == "auto" else None)
        assert stats.frames == 10 and stats.faces_swapped == 10
        outs[name] = decode(tmp_path / f"{name}.mp4")
    (a, pa), (b, pb) = outs["cpu"], outs["gpu"]
    src, ps = decode(clip)
    assert pa == pb == ps
    assert worst_psnr(a, b, f"face stack ({runner}): GPU vs CPU job") >= floor
    assert min(psnr(x, y) for x, y in zip(b, src)) < 35.0  # the face was swapped and enhanced
