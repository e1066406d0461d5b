"""Watermark v2 embedding cost on the GPU and the CPU, per frame (target on the GPU: 200 us at 1080p).

    tools/device_check.sh none; PYTHONPATH=/tmp/shim:/tmp/site python3 tools/bench_watermark_v2.py --out "$OUT"
    python tools/bench_watermark_v2.py --cpu-only [--baseline REV] --out docs/benchmarks    (the CPU paths alone)

For 1080p and 720p: the median GPU time of `kernels/cuda/watermark_v2.cu` as a CUDA-graph replay (the
GPU's own time) and per Python call (CUDA events around each call), and the CPU time of the NumPy
reference that the CPU pipeline runs (`WatermarkerV2.embed` on a host frame). Before timing, the
kernel's output is checked against the reference, bit for bit. Writes watermark_v2.json (records as
docs/performance.md, "Benchmark records", describes) into --out; copy it to docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import cpu_time_us, gpu_time_us, graph_time_us  # noqa: E402
from bench_watermark import smooth_frame  # noqa: E402
from benchlib import cpu_name, gpu_name, run_fields  # noqa: E402

SIZES = {"1080p": (1080, 1920), "720p": (720, 1280)}


def baseline_kernels(rev: str) -> Any:
    """kernels/watermark_v2.py as it was at git revision `rev`, loaded as a module beside today's (its
    relative imports resolve in today's package), to time its CPU path in the same run."""
    import importlib.util
    import subprocess

    src = subprocess.run(["git", "show", f"{rev}:kernels/watermark_v2.py"], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    name = "swapstream.kernels._watermark_v2_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "swapstream.kernels"
    sys.modules[name] = mod
    exec(compile(src, f"{rev}:kernels/watermark_v2.py", "exec"), mod.__dict__)
    return mod


def cpu_only(out: Path, baseline: str | None = None) -> None:
    """The CPU pipeline's embedder (`WatermarkerV2.embed` on host frames: the OpenCV path with its
    working arrays kept) against the NumPy reference, side by side, after checking that both give
    the same frame; with `baseline`, also that revision's CPU path (same check); and v1's embedder
    (`Watermarker.embed`, the mark every output gets by default), the cost v2 would replace. Timings
    alternate between the paths, call by call, so that a machine whose speed drifts affects them alike.
    Writes watermark_v2_cpu.json and .md."""
    from swapstream.kernels.watermark_v2 import embed_masked_ref
    from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker
    from swapstream.watermark_v2 import MASK, WatermarkerV2

    rng = np.random.default_rng(0)
    command = "python tools/bench_watermark_v2.py --cpu-only" + (f" --baseline {baseline}" if baseline else "") + \
        " --out docs/benchmarks"
    cpu = run_fields(cpu_name(), command)
    old = baseline_kernels(baseline) if baseline else None
    wm = WatermarkerV2(Payload(PRODUCT_SWAPSTREAM, 0x5EC0A11D))
    wm1 = Watermarker(Payload(PRODUCT_SWAPSTREAM, 0x5EC0A11D))
    records: list[dict[str, Any]] = []
    rows = []
    for name, (h, w) in SIZES.items():
        host = smooth_frame(rng, h, w)
        pattern = wm.pattern(h, w)
        paths: dict[str, Any] = {"cpu": lambda f: wm.embed(f),
                                 "cpu_reference": lambda f: embed_masked_ref(f, pattern, MASK)}
        if old is not None:
            scratch = old.CpuScratch(h, w)
            params = old.MaskParams(MASK.inv_act, MASK.m_lo, MASK.m_hi)
            paths[f"cpu_at_{baseline}"] = lambda f: old.embed_masked_cpu(f, pattern, params, scratch)
        want = host.copy()
        embed_masked_ref(want, pattern, MASK)
        for kind, fn in paths.items():
            # Checked equal to the reference first; the call also warms the path up (first-call
            # allocations, OpenCV's thread pool).
            got = host.copy()
            fn(got)
            if not np.array_equal(got, want):
                raise SystemExit(f"{name}: the {kind} path's frame differs from the reference")
        timed = {**paths, "v1_cpu": lambda f: wm1.embed(f)}  # another mark: timed, not compared
        timed["v1_cpu"](host.copy())  # its first call builds its pattern
        frame = host.copy()
        times: dict[str, list[float]] = {k: [] for k in timed}
        for _ in range(40):
            for kind, fn in timed.items():
                t0 = time.perf_counter()
                fn(frame)
                times[kind].append((time.perf_counter() - t0) * 1e6)
        p50 = {k: float(np.median(v)) for k, v in times.items()}
        for kind, value in p50.items():
            records.append({"metric": f"watermark_v2_embed_{name}_{kind}", "value": round(value, 1), "unit": "us",
                            "stat": "p50", "config": {"size": f"{w}x{h}", "reps": 40}, **cpu})
        then_cell = f" {p50[f'cpu_at_{baseline}'] / 1e3:.2f} ms |" if old is not None else ""
        rows.append(f"| {name} | {p50['cpu'] / 1e3:.2f} ms |{then_cell} {p50['cpu_reference'] / 1e3:.2f} ms | "
                    f"{p50['v1_cpu'] / 1e3:.2f} ms |")
        print(f"{name}: " + ", ".join(f"{k} {v:.0f} us" for k, v in p50.items()), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "watermark_v2_cpu.json").write_text(json.dumps(records, indent=2) + "\n")
    (out / "watermark_v2_cpu.md").write_text("\n".join([
        f"# Watermark v2 embedding on the CPU ({cpu['device']}, {cpu['commit']}, {cpu['date']})", "",
        f"`{cpu['command']}`. Median of 40 calls per frame and path, the paths called in turn, one thread "
        "calling (OpenCV uses its own threads), a smooth random frame; every v2 path checked equal to the "
        "reference, element by element, first (v1 is another mark: timed, not compared). At 720p30 a "
        "frame has 33 ms; the CPU live path's main thread is already busy for most of it (docs/performance.md).", "",
        "| size | `WatermarkerV2.embed` (OpenCV, kept working arrays) |"
        + (f" the same at {baseline} |" if old is not None else "") + " NumPy reference |"
        + " v1 (`Watermarker.embed`, the default mark) |",
        "|---|---|---|---|" + ("---|" if old is not None else ""),
        *rows, ""]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu-only", action="store_true", help="the CPU paths alone (no GPU needed)")
    ap.add_argument("--baseline", help="with --cpu-only: also time this git revision's CPU path")
    args = ap.parse_args()
    if args.cpu_only:
        cpu_only(args.out, args.baseline)
        return
    import cupy as cp

    from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload
    from swapstream.watermark_v2 import WatermarkerV2

    rng = np.random.default_rng(0)
    gpu = run_fields(gpu_name(), "PYTHONPATH=/tmp/shim:/tmp/site python3 tools/bench_watermark_v2.py")
    cpu = {**gpu, "device": cpu_name()}
    records: list[dict[str, Any]] = []
    wm = WatermarkerV2(Payload(PRODUCT_SWAPSTREAM, 0x5EC0A11D))
    for name, (h, w) in SIZES.items():
        host = smooth_frame(rng, h, w)
        want = host.copy()
        wm.embed(want)
        dev = cp.asarray(host)
        wm.embed(dev)
        if not np.array_equal(dev.get(), want):
            raise SystemExit(f"{name}: the kernel's frame differs from the reference")
        frame = cp.asarray(host)
        graph = graph_time_us(cp, lambda: wm.embed(frame))
        call = gpu_time_us(cp, lambda: wm.embed(frame))
        cpu_us = cpu_time_us(lambda: wm.embed(host))
        cfg = {"size": f"{w}x{h}", "target_us": 200.0}
        records.append({"metric": f"watermark_v2_embed_{name}_graph", "value": None if graph is None else round(graph, 1),
                        "unit": "us", "stat": "p50", "config": cfg, **gpu})
        records.append({"metric": f"watermark_v2_embed_{name}_call", "value": round(call, 1), "unit": "us",
                        "stat": "p50", "config": cfg, **gpu})
        records.append({"metric": f"watermark_v2_embed_{name}_cpu", "value": round(cpu_us, 1), "unit": "us",
                        "stat": "p50", "config": {"size": f"{w}x{h}"}, **cpu})
        print(f"{name}: graph {graph} us, call {call:.1f} us, CPU {cpu_us:.0f} us", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watermark_v2.json").write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
