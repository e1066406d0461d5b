"""Watermark v2 embedding cost on the GPU and the CPU, per frame (target on the GPU: 200 us at 1080p).

    tools/device_check.sh none; PYTHONPATH=/tmp/shim:/tmp/site python3 tools/bench_watermark_v2.py --out "$OUT"
    python tools/bench_watermark_v2.py --cpu-only --out docs/benchmarks    (the CPU paths alone)

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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import cpu_time_us, gpu_time_us, graph_time_us  # noqa: E402
from bench_watermark import smooth_frame  # noqa: E402
from benchlib import cpu_name, gpu_name, run_fields  # noqa: E402

SIZES = {"1080p": (1080, 1920), "720p": (720, 1280)}


def cpu_only(out: Path) -> None:
    """The CPU pipeline's embedder (`WatermarkerV2.embed` on host frames: the OpenCV path with its
    working arrays kept) against the NumPy reference, side by side, after checking that both give
    the same frame. Writes watermark_v2_cpu.json and .md."""
    from swapstream.kernels.watermark_v2 import embed_masked_ref
    from swapstream.watermark import PRODUCT_SWAPSTREAM, Payload
    from swapstream.watermark_v2 import MASK, WatermarkerV2

    rng = np.random.default_rng(0)
    cpu = run_fields(cpu_name(), "python tools/bench_watermark_v2.py --cpu-only --out docs/benchmarks")
    wm = WatermarkerV2(Payload(PRODUCT_SWAPSTREAM, 0x5EC0A11D))
    records: list[dict[str, Any]] = []
    rows = []
    for name, (h, w) in SIZES.items():
        host = smooth_frame(rng, h, w)
        want, got = host.copy(), host.copy()
        embed_masked_ref(want, wm.pattern(h, w), MASK)
        wm.embed(got)
        if not np.array_equal(got, want):
            raise SystemExit(f"{name}: the CPU path's frame differs from the reference")
        frame = host.copy()
        fast = cpu_time_us(lambda: wm.embed(frame), reps=40)
        ref = cpu_time_us(lambda: embed_masked_ref(frame, wm.pattern(h, w), MASK), reps=40)
        for kind, value in (("cpu", fast), ("cpu_reference", ref)):
            records.append({"metric": f"watermark_v2_embed_{name}_{kind}", "value": round(value, 1), "unit": "us",
                            "stat": "p50", "config": {"size": f"{w}x{h}", "reps": 40}, **cpu})
        rows.append(f"| {name} | {fast / 1e3:.2f} ms | {ref / 1e3:.2f} ms |")
        print(f"{name}: CPU path {fast:.0f} us, reference {ref:.0f} us", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "watermark_v2_cpu.json").write_text(json.dumps(records, indent=2) + "\n")
    (out / "watermark_v2_cpu.md").write_text("\n".join([
        f"# Watermark v2 embedding on the CPU ({cpu['device']}, {cpu['commit']}, {cpu['date']})", "",
        f"`{cpu['command']}`. Median of 40 calls per frame, one thread calling (OpenCV uses its own "
        "threads), a smooth random frame; both paths checked equal, element by element, first.", "",
        "| size | `WatermarkerV2.embed` (OpenCV, kept working arrays) | NumPy reference |", "|---|---|---|",
        *rows, ""]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu-only", action="store_true", help="the CPU paths alone (no GPU needed)")
    args = ap.parse_args()
    if args.cpu_only:
        cpu_only(args.out)
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
