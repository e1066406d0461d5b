"""Face-stack benchmark: the occluder, the parser and the enhancer per face, in the real architectures.

    python tools/bench_face_stack.py --out DIR [--models xseg_1,bisenet_resnet_18,gfpgan_1.4,...]
        [--batches 1,4] [--device cuda|cpu] [--reps 50]    (tools/device_check.sh face_stack)

Each model is built in its real architecture with random weights by tools/make_face_models.py (the
real weights cannot be downloaded here; the cost is the architecture's) and run by the product's
`TorchRunner`, as the face stack runs it: on a GPU in fp16, channels_last, one CUDA graph per batch
size; on the CPU in fp32 (a smoke run: its times are not the product's CPU path, which is ONNX
Runtime). Inputs are random, in each model's own layout and size (docs/neural.md); CodeFormer's
`weight` (its fidelity) gets the face stack's 0.5. The figure is the median over `--reps` calls of
CUDA-event time on a GPU (wall time on the CPU), per call and per face.
Memory: PyTorch's peak allocation after the model's weights and every batch size's graph, per model.
Writes face_stack.json and face_stack.md into --out.
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
from benchlib import batch_sizes, cpu_name, median_ms, run_fields, wall_median_ms  # noqa: E402

# Model -> (builder in make_face_models, what it is). The input's name, size and layout are the zoo's
# (engines/zoo.py), as the face stack feeds them.
MODELS: dict[str, tuple[str, str]] = {
    "xseg_1": ("xseg", "occluder (XSeg)"),
    "bisenet_resnet_18": ("bisenet", "region parser (BiSeNet, ResNet-18)"),
    "gfpgan_1.4": ("gfpgan_1_4", "enhancer (GFPGAN v1.4 architecture)"),
    "codeformer": ("codeformer", "enhancer (CodeFormer architecture)"),
    "gpen_bfr_512": ("gpen_bfr_512", "enhancer (GPEN-BFR-512 architecture)"),
    "restoreformer_plus_plus": ("restoreformer_plus_plus", "enhancer (RestoreFormer++ architecture)"),
}


def input_of(name: str) -> tuple[str, tuple[int, ...]]:
    """The zoo model's input name and its shape per face."""
    from swapstream.engines.zoo import get_spec

    spec = get_spec(name)
    assert spec.size is not None, f"{name}: the zoo gives no input size"
    shape = (spec.size, spec.size, 3) if spec.layout == "NHWC" else (3, spec.size, spec.size)
    return spec.input_names[0], shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if not names:
        sys.exit(f"error: --models names none; give some of {', '.join(MODELS)}")
    if unknown:
        sys.exit(f"error: --models takes names among {', '.join(MODELS)}; got {', '.join(unknown)}")
    batches = batch_sizes(args.batches, 8)
    if args.reps < 1:
        sys.exit(f"error: --reps must be at least 1, got {args.reps}")
    import torch

    import make_face_models

    from swapstream.engines.torch_runner import TorchRunner

    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("error: --device cuda needs a CUDA GPU that PyTorch sees; use --device cpu for a smoke run")
    device = torch.cuda.get_device_name() if gpu else cpu_name()
    precision = "fp16" if gpu else "fp32"
    command = "python tools/bench_face_stack.py " + " ".join(sys.argv[1:])
    common = run_fields(device, command)
    rng = np.random.default_rng(0)
    records: list[dict[str, Any]] = []
    rows: list[tuple[str, str, dict[int, float], float | None]] = []
    for name in names:
        builder, what = MODELS[name]
        input_name, shape = input_of(name)
        t0 = time.perf_counter()
        model = getattr(make_face_models, builder)()
        print(f"{name}: built in {time.perf_counter() - t0:.1f} s", flush=True)
        per_call: dict[int, float] = {}
        peak: float | None = None
        if gpu:
            import cupy as cp

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            stream = cp.cuda.Stream(non_blocking=True)
        with TorchRunner(model, device=args.device, precision=precision, max_batch=max(batches)) as tr:
            print(f"{name}: {tr.architecture} on {args.device} in {precision}", flush=True)
            for b in batches:
                x = rng.uniform(-1, 1, (b, *shape)).astype(np.float32)
                extra = {s.name: np.full((1,), 0.5, np.float32) for s in tr.inputs if s.name == "weight"}
                if gpu:
                    feed = {input_name: cp.asarray(x), **{k: cp.asarray(v) for k, v in extra.items()}}
                    per_call[b] = median_ms(cp, lambda r=tr, f=feed: r.infer(f, stream), stream, reps=args.reps)
                else:
                    feed = {input_name: x, **extra}
                    per_call[b] = wall_median_ms(lambda r=tr, f=feed: r.infer(f, None), args.reps)
                print(f"{name}: batch {b}: {per_call[b]:.3f} ms a call, {per_call[b] / b:.3f} ms a face",
                      flush=True)
            # What ran, not what was asked: a failed capture runs eagerly, a bad fp16 batch in fp32.
            reruns, graphs, graph_failures = tr.fp32_reruns, bool(tr.cuda_graphs and gpu), tr.graph_failures
        del tr  # its module, graphs and fp32 copy go before the next model's memory is measured
        if gpu:
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            torch.cuda.empty_cache()
        for b, ms in per_call.items():
            records.append({"metric": f"face_stack_{name.replace('.', '_')}_ms_per_face_b{b}",
                            "value": round(ms / b, 3), "unit": "ms", "stat": "p50",
                            "config": {"model": name, "what": what, "batch": b, "ms_per_call": round(ms, 3),
                                       "precision": precision, "cuda_graphs": graphs,
                                       "graph_failures": graph_failures, "input": [b, *shape],
                                       "fp32_reruns_all_batches": reruns, "reps": args.reps}, **common})
        if peak is not None:
            records.append({"metric": f"face_stack_{name.replace('.', '_')}_peak_memory", "value": round(peak, 1),
                            "unit": "MiB", "stat": "max", "config": {"model": name, "batches": batches},
                            **common})
        rows.append((name, what, per_call, peak))
        del model
        # After every model, so that a run cut by a time limit keeps the models that finished.
        write(args.out, records, rows, batches, device, common, command, precision, gpu, args.reps)


def write(out: Path, records: list[dict[str, Any]], rows: list[tuple[str, str, dict[int, float], float | None]],
          batches: list[int], device: str, common: dict[str, Any], command: str, precision: str, gpu: bool,
          reps: int) -> None:
    """face_stack.json and face_stack.md in `out`, for the models measured so far."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "face_stack.json").write_text(json.dumps(records, indent=1) + "\n")
    timer = "CUDA events" if gpu else "wall time"
    head = " | ".join(f"batch {b}: ms a face (a call)" for b in batches)
    lines = [f"# Face stack per face ({device}, {common['commit']}, {common['date']})", "",
             f"Command: `{command}`. Real architectures, random weights (tools/make_face_models.py), run "
             f"by the product's TorchRunner in {precision}" + (", channels_last, one CUDA graph per batch size"
                                                                if gpu else "") +
             f"; median of {reps} calls, {timer}, inputs already on the device.", "",
             f"| model | what | {head} | peak memory |", "|---|---|" + "---|" * len(batches) + "---|"]
    for name, what, per_call, peak in rows:
        cells = " | ".join(f"{per_call[b] / b:.3f} ({per_call[b]:.3f})" for b in batches)
        mem = f"{peak:.0f} MiB" if peak is not None else "n/a"
        lines.append(f"| {name} | {what} | {cells} | {mem} |")
    if not gpu:
        lines += ["", "A CPU smoke run of the tool: the product's CPU path runs these models in ONNX Runtime."]
    (out / "face_stack.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
