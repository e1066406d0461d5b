"""Swap-stage benchmark: the full-size inswapper architecture (random weights) at batch 1-4.

    python tools/bench_swap.py --out DIR     (run by tools/device_check.sh on the GPU machine)

In one run, on the same module and inputs, it times:
- `torch_runner`: our TorchRunner, fp16, channels_last, one CUDA graph per batch size;
- `eager_fp16`: the same native module called eagerly in fp16 (plain PyTorch, no graphs, NCHW);
- `eager_fp32`: the same, fp32 (TF32 as PyTorch defaults it).
Each figure is the median over 50 calls of CUDA-event time, reported per call and per face. Memory:
PyTorch's peak allocation after capturing each batch size, and its growth per extra batch slot.
Writes swap_stage.json and swap_stage.md into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import median_ms, run_fields  # noqa: E402
from make_test_models import inswapper  # noqa: E402

from swapstream.engines.torch_models import build_inswapper, onnx_initializers  # noqa: E402
from swapstream.engines.torch_runner import TorchRunner  # noqa: E402


def main() -> None:
    import cupy as cp
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model = inswapper(width=128, blocks=6, seed=0)
    inits = onnx_initializers(model)
    params = sum(int(np.prod(v.shape)) for k, v in inits.items() if k != "emap")
    print(f"inswapper architecture: {params / 1e6:.1f} M parameters")
    dev = torch.cuda.get_device_name()
    common = run_fields(dev, "tools/device_check.sh bench")
    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    feeds = {}
    for b in (1, 2, 3, 4):
        src = rng.normal(0, 1, (b, 512)).astype(np.float32)
        src /= np.linalg.norm(src, axis=1, keepdims=True)
        feeds[b] = {"target": cp.asarray(rng.uniform(0, 1, (b, 3, 128, 128)).astype(np.float32)),
                    "source": cp.asarray(src)}
    records: list[dict[str, Any]] = []
    results: dict[str, dict[int, float]] = {}

    torch.cuda.reset_peak_memory_stats()
    base_mem = torch.cuda.memory_allocated()
    peaks: dict[int, int] = {}
    with TorchRunner(model, device="cuda", precision="fp16") as tr:
        results["torch_runner"] = {}
        for b in (1, 2, 3, 4):
            results["torch_runner"][b] = median_ms(cp, lambda: tr.infer(feeds[b], stream), stream)
            peaks[b] = torch.cuda.max_memory_allocated() - base_mem
        reruns, graph_failures = tr.fp32_reruns, tr.graph_failures

    compiled_ok = True
    try:
        with TorchRunner(model, device="cuda", precision="fp16", compile=True) as trc:
            results["torch_runner_compiled"] = {}
            for b in (1, 2, 3, 4):
                results["torch_runner_compiled"][b] = median_ms(cp, lambda: trc.infer(feeds[b], stream), stream)
            # Same answer as the uncompiled runner (fp16 both): relative difference.
            with TorchRunner(model, device="cuda", precision="fp16") as tr2:
                a = cp.asarray(trc.infer(feeds[4], stream)["output"]).copy()
                r = cp.asarray(tr2.infer(feeds[4], stream)["output"])
                stream.synchronize()
                compiled_diff = float(cp.linalg.norm(a - r) / cp.linalg.norm(r))
    except Exception as e:  # a compiler failure must not cost the rest of the run
        compiled_ok = False
        compiled_diff = float("nan")
        print(f"torch.compile variant failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")

    for name, dtype in (("eager_fp16", torch.float16), ("eager_fp32", torch.float32)):
        module = build_inswapper(inits).to("cuda", dtype=dtype).eval()
        ext = torch.cuda.ExternalStream(stream.ptr)
        results[name] = {}
        for b in (1, 2, 3, 4):
            t = torch.from_dlpack(feeds[b]["target"])
            s = torch.from_dlpack(feeds[b]["source"])

            def call(m: Any = module, t: Any = t, s: Any = s) -> None:  # bound now: `module` is deleted below
                with torch.cuda.stream(ext), torch.inference_mode():
                    m(t, s)

            results[name][b] = median_ms(cp, call, stream)
        del module
        torch.cuda.empty_cache()

    for name, per_b in results.items():
        for b, ms in per_b.items():
            records.append({"metric": f"inswapper_{name}_ms_per_face_b{b}", "value": round(ms / b, 3),
                            "unit": "ms", "stat": "p50",
                            "config": {"batch": b, "ms_per_call": round(ms, 3), "params_m": round(params / 1e6, 1)},
                            **common})
    for b in (1, 2, 3, 4):
        records.append({"metric": f"torch_runner_peak_memory_b{b}", "value": round(peaks[b] / 2**20, 1),
                        "unit": "MiB", "stat": "max", "config": {"batch": b}, **common})
    slot = [(peaks[b] - peaks[b - 1]) / 2**20 for b in (2, 3, 4)]
    records.append({"metric": "torch_runner_memory_per_extra_batch_slot", "value": round(float(np.mean(slot)), 1),
                    "unit": "MiB", "stat": "mean", "config": {"deltas": [round(x, 1) for x in slot]}, **common})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "swap_stage.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [f"# Swap stage: inswapper architecture ({params / 1e6:.1f} M parameters, random weights), {dev}",
             "", f"`{common['command']}`, commit {common['commit']}, {common['date']}. Median of 50 "
             "calls, CUDA events, inputs already on the GPU. ms per face (ms per call / batch).", "",
             "| batch | torch runner (fp16, graphs) | + torch.compile | eager fp16 | eager fp32 | target |",
             "|---|---|---|---|---|---|"]
    target = {1: "≤ 1.6", 4: "≤ 1.0"}
    comp = results.get("torch_runner_compiled", {})
    for b in (1, 2, 3, 4):
        c = f"{comp[b] / b:.3f}" if b in comp else "failed"
        lines.append(f"| {b} | {results['torch_runner'][b] / b:.3f} | {c} | {results['eager_fp16'][b] / b:.3f} "
                     f"| {results['eager_fp32'][b] / b:.3f} | {target.get(b, '')} |")
    lines += ["", f"Compiled vs uncompiled runner output at batch 4: relative difference {compiled_diff:.2e}"
              f" ({'compiled' if compiled_ok else 'compile failed'})."]
    lines += ["", "Peak memory of the torch runner after capturing batch 1..4: " +
              ", ".join(f"{peaks[b] / 2**20:.0f} MiB" for b in (1, 2, 3, 4)) +
              f"; per extra batch slot: {np.mean(slot):.0f} MiB. fp32 reruns: {reruns}; graph "
              f"capture failures: {graph_failures}.", ""]
    (args.out / "swap_stage.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
