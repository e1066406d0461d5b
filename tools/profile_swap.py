"""Where the inswapper architecture spends its GPU time, and what Inductor settings change it.

    python tools/profile_swap.py [--batches 1,4] [--variants eager,compile,freeze,autotune]
        [--profile compile] [--out DIR]          (on the GPU machine)

Each variant is the fp16 channels_last module, captured in one CUDA graph per batch size and timed
with CUDA events (median of 50 replays), as the torch runner runs it:
- eager: no torch.compile;
- compile: torch.compile(fullgraph=True) with Inductor's defaults (what the runner does);
- freeze: the same with `torch._inductor.config.freezing` (weights become constants: Inductor may
  fold them and pick convolution layouts ahead of time);
- autotune: mode="max-autotune-no-cudagraphs" (Inductor benchmarks kernel configurations; minutes).
`--profile VARIANT` prints the kernels of that variant's largest batch by share of GPU time.
Writes swap_variants.json (and .md) under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import gpu_name, median_ms, run_fields  # noqa: E402
from make_test_models import inswapper  # noqa: E402

from swapstream.engines.torch_models import build_inswapper, onnx_initializers  # noqa: E402


def variant(name: str, base: Any) -> Any:
    """A fresh callable for `name` (each compile gets its own copy: Inductor caches per module)."""
    import copy

    import torch
    import torch._inductor.config as ic

    m = copy.deepcopy(base)
    if name == "eager":
        return m
    ic.freezing = name == "freeze"
    if name == "autotune":
        return torch.compile(m, dynamic=False, fullgraph=True, mode="max-autotune-no-cudagraphs")
    return torch.compile(m, dynamic=False, fullgraph=True)


def time_graph(fn: Any, t: Any, s: Any, reps: int = 50) -> tuple[float, Any]:
    """Median ms per call of `fn(t, s)` replayed from a CUDA graph, and the graph."""
    import cupy
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile (first call) and settle cuDNN's autotuning before capture
            fn(t, s)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(t, s)
    # Replays go to torch's current stream, the legacy default stream: CuPy's null stream.
    return median_ms(cupy, g.replay, cupy.cuda.Stream.null, reps, warm=5), g


def kernel_table(g: Any) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            g.replay()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90)


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--variants", default="eager,compile,freeze")
    ap.add_argument("--profile", default="compile")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    base = build_inswapper(onnx_initializers(inswapper(width=128, blocks=6, seed=0)))
    base = base.to("cuda", dtype=torch.float16).to(memory_format=torch.channels_last).eval()
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[dict[str, Any]] = []
    ref: dict[int, Any] = {}
    with torch.inference_mode():
        for name in args.variants.split(","):
            fn = variant(name, base)
            for b in batches:
                gen = torch.Generator(device="cuda").manual_seed(b)
                t = torch.rand(b, 3, 128, 128, device="cuda", generator=gen).contiguous(memory_format=torch.channels_last)
                s = torch.nn.functional.normalize(torch.randn(b, 512, device="cuda", generator=gen), dim=1)
                t0 = time.perf_counter()
                ms, g = time_graph(fn, t, s)
                build_s = time.perf_counter() - t0
                out = fn(t, s).float()
                if b not in ref:
                    ref[b] = out  # the first variant listed is the reference (eager by default)
                rel = float((out - ref[b]).abs().max() / ref[b].abs().max())
                row = {"variant": name, "batch": b, "ms_per_call": round(ms, 4),
                       "ms_per_face": round(ms / b, 4), "build_s": round(build_s, 1), "max_rel_diff": rel}
                print(json.dumps(row), flush=True)
                rows.append(row)
                if name == args.profile and b == max(batches):
                    print(f"kernels of {name} at batch {b}:\n{kernel_table(g)}", flush=True)
                del g
            del fn
            torch._dynamo.reset()
    if args.out:
        common = run_fields(gpu_name(), f"python tools/profile_swap.py --batches {args.batches} --variants {args.variants}")
        args.out.mkdir(parents=True, exist_ok=True)
        recs = [{"metric": f"swap_{r['variant']}_b{r['batch']}", "value": r["ms_per_face"], "unit": "ms/face",
                 "stat": "median", "config": r, **common} for r in rows]
        (args.out / "swap_variants.json").write_text(json.dumps(recs, indent=1) + "\n")
        lines = [f"# Swap model variants ({common['device']})", "", f"`{common['command']}`, commit {common['commit']}, "
                 f"{common['date']}. fp16, channels_last, one CUDA graph per batch; median of 50 replays.", "",
                 f"| variant | batch | ms per face | build s | max rel. diff vs {args.variants.split(',')[0]} |", "|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['batch']} | {r['ms_per_face']} | {r['build_s']} | {r['max_rel_diff']:.2e} |" for r in rows]
        (args.out / "swap_variants.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
