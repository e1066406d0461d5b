"""Where the runtime's swap spends a frame on the GPU: the wall time of one backend `swap` call (what
the device thread waits for), the GPU time of its kernels and copies (CUPTI, through torch.profiler:
every kernel of the process, CuPy's and PyTorch's, summed per call), and the host functions that
take the wall time (cProfile).

    python tools/profile_mesh_gpu.py --clip .bench/streams_720p30.mp4 [--reps 60] [--out DIR]
    python tools/profile_mesh_gpu.py --clip ... --neural [--batches 1,4]

By default the `mesh` backend, with and without the occlusion mask. With `--neural`, the zoo
swapper's backend as `serve` builds it (the full-size inswapper architecture with random weights,
fp16, CUDA graphs) alone, with the XSeg occluder, and with the occluder and the GFPGAN v1.4 enhancer
(real architectures, random weights), at each batch size (that many copies of the frame's face in
one call): set against the networks' own times (tools/bench_face_stack.py), the rest is the glue
between them. A diagnostic for the developers, not a benchmark record: it runs the product's
backend on one decoded frame of the clip and its face as the GPU analysis finds it, on a quiet GPU,
on a non-blocking CUDA stream as a serve worker's swap thread does. Writes
`<out>/profile_mesh_gpu.json` (`profile_neural_gpu.json` with --neural) and prints the profile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import batch_sizes  # noqa: E402


def first_frame(clip: Path) -> Any:
    import av

    with av.open(str(clip)) as c:
        for f in c.decode(video=0):
            return f.to_ndarray(format="rgb24")
    raise SystemExit(f"error: '{clip}' has no video frame")


def timed(fn: Any, reps: int) -> list[float]:
    import cupy

    out = []
    for _ in range(reps):
        cupy.cuda.get_current_stream().synchronize()
        t = time.perf_counter()
        fn()
        cupy.cuda.get_current_stream().synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def gpu_time(fn: Any, reps: int) -> dict[str, float]:
    """GPU time per call of `fn`: the summed durations of the kernels, copies and memsets CUPTI
    records over `reps` calls, divided by `reps` (what the GPU itself spends, whatever the host
    does between launches), and the number of those per call."""
    import cupy
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cupy.cuda.get_current_stream().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        cupy.cuda.get_current_stream().synchronize()
    ops = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    if not ops:
        raise SystemExit("error: the profiler recorded no GPU work (CUPTI unavailable?)")
    total_us = sum(e.time_range.elapsed_us() for e in ops)
    return {"gpu_us_per_call": round(total_us / reps, 1), "gpu_ops_per_call": round(len(ops) / reps, 1)}


def profile_case(name: str, backend: Any, frame: Any, faces: list[Any], source: Any, reps: int) -> dict[str, Any]:
    """Wall time, GPU time and host profile of `backend.swap` on `faces` of a copy of `frame`."""
    import cupy

    from swapstream.runtime.swappers import SwapItem

    ident = backend.identity(source)
    work = frame.copy()
    if not backend.swap([SwapItem(work, faces, ident)])[0]:
        raise SystemExit(f"error: {name} swapped no face")

    def run() -> None:
        cupy.copyto(work, frame)
        backend.swap([SwapItem(work, faces, ident)])

    ms = timed(run, reps)
    prof = cProfile.Profile()
    prof.enable()
    timed(run, 20)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    g = gpu_time(run, 20)
    # Less the copy that resets the frame before each call.
    reset = gpu_time(lambda: cupy.copyto(work, frame), 20)
    g = {"gpu_us_per_call": round(g["gpu_us_per_call"] - reset["gpu_us_per_call"], 1),
         "gpu_ops_per_call": round(g["gpu_ops_per_call"] - reset["gpu_ops_per_call"], 1)}
    out = {"faces_per_call": len(faces), "p50_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3),
           "max_ms": round(max(ms), 3), **g, "gpu_us_per_face": round(g["gpu_us_per_call"] / len(faces), 1)}
    print(f"== {name}: p50 {statistics.median(ms):.3f} ms, min {min(ms):.3f}, max {max(ms):.3f} "
          f"(wall per call, synchronised); GPU time {g['gpu_us_per_call']:.1f} us per call in "
          f"{g['gpu_ops_per_call']:.0f} kernels and copies")
    print(text.getvalue())
    return out


NEURAL_CASES: dict[str, list[str]] = {
    "inswapper": [],
    "inswapper+occluder": ["mask.types=box,occlusion"],
    "inswapper+occluder+gfpgan": ["mask.types=box,occlusion", "enhancer=gfpgan_1.4"],
}
"""The face stack's variants: their settings over the swapper's."""


def neural_configs(models: Path, names: list[str], max_batch: int) -> list[tuple[str, Any]]:
    """The synthetic zoo models written into `models`, and the named stack variants' settings.
    `max_batch`: the most faces a call of the run has (the backend compiles every size up to it)."""
    from bench_pipeline import write_synthetic_models

    from swapstream.config import load_config

    write_synthetic_models(models, face_stack=True)
    base = [f"models_dir={models}", "swapper=inswapper_128", "neural.download=false", f"neural.max_batch={max_batch}"]
    return [(name, load_config("multi_stream", base + NEURAL_CASES[name])) for name in names]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--neural", action="store_true", help="the zoo swapper with the face stack's variants")
    ap.add_argument("--batches", default="1,4", help="with --neural: faces per call, comma-separated (1-4)")
    ap.add_argument("--cases", default=None,
                    help="with --neural: the variants to run, comma-separated (default: all of "
                         f"{', '.join(NEURAL_CASES)}); each compiles its networks first, minutes for GFPGAN")
    args = ap.parse_args()
    batches = batch_sizes(args.batches, 4)  # up to neural.max_batch
    wanted = list(NEURAL_CASES) if args.cases is None else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in NEURAL_CASES]
    if unknown or not wanted:
        sys.exit(f"error: --cases {args.cases!r}: choose from {', '.join(NEURAL_CASES)}")
    if not args.clip.is_file():
        sys.exit(f"error: no clip at '{args.clip}': make one with python tools/make_bench_clips.py")

    import cupy

    from swapstream.config import load_config
    from swapstream.demo import astronaut
    from swapstream.gpu.analyser import GpuFaceAnalyser
    from swapstream.runtime.swappers import MeshBackend, NeuralBackend
    from swapstream.types import Frame

    cfg = load_config("multi_stream")
    cfg.landmarks.compile = False
    host = first_frame(args.clip)
    frame = cupy.asarray(host)
    analyser = GpuFaceAnalyser(cfg)
    analyser.prepare()
    tracker = analyser.tracker()
    faces = []
    for i in range(3):  # the tracker's first frames: detection, then tracked landmarks
        faces = tracker.track(Frame(frame, pts=i, time_base=Fraction(1, 30), index=i))
    if not faces:
        raise SystemExit(f"error: no face found in the first frame of '{args.clip}'")
    result: dict[str, Any] = {"clip": str(args.clip), "frame": list(host.shape), "faces": len(faces),
                              "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    cases: list[tuple[str, Any, list[int]]] = []  # (label, backend maker, faces per call of each run)
    if args.neural:
        models = Path(tempfile.mkdtemp(prefix="profile-neural-")) / "models"
        for name, c in neural_configs(models, wanted, max(batches)):
            cases.append((name, lambda c=c: NeuralBackend("inswapper_128", c, "cuda:0"), batches))
    else:
        for name, occlusion in (("mesh", False), ("mesh+occlusion", True)):
            c = cfg.model_copy(deep=True)
            c.mask.occlusion = occlusion
            cases.append((name, lambda c=c: MeshBackend(c, "cuda:0"), [len(faces)]))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / ("profile_neural_gpu.json" if args.neural else "profile_mesh_gpu.json")
    for name, make, sizes in cases:
        # A serve worker's swap thread runs on a non-blocking stream of its own (runtime/manager.py).
        with cupy.cuda.Stream(non_blocking=True):
            backend = make()
            try:
                for n in sizes:
                    label = f"{name} b{n}" if args.neural else name
                    result[label] = profile_case(label, backend, frame, (faces * 4)[:n], astronaut(), args.reps)
                    # After every case: a run stopped by a time limit (GFPGAN's compile takes
                    # minutes) keeps the cases it finished.
                    out.write_text(json.dumps(result, indent=1) + "\n")
            finally:
                backend.close()
    analyser.close()
    print(json.dumps(result))  # the file has had every case since its own


if __name__ == "__main__":
    main()
