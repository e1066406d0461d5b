"""Watermark v2 on unmarked pictures: how often a sum gets past the sync gate, and how often a mark
is found where there is none (CPU).

    python tools/watermark_false_marks.py [--frames 10000] [--out docs/benchmarks]

Each of `--frames` varied unmarked frames (`watermark_robustness.varied_unmarked`: scikit-image
pictures zoomed, turned, shifted, flipped, exposed, noised, half through JPEG, 7 sizes; every 50th
a gradient) is its own window, decoded by the shipped detector. Per window it records what each of
the detector's tries gave (the plain sum, and the motion-cleaned sum where a moving picture gets
one; a single frame does not): the sync peak, whether it passed `SYNC_GATE` (only then are folds
decoded, up to `LIST_DECODE` of them) and whether a mark was found. The robustness benchmark counts
the false marks alone; this says how close the gate let unmarked pictures come.
Writes watermark_false_marks.json and watermark_false_marks.md into --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, run_fields  # noqa: E402
from watermark_robustness import varied_unmarked  # noqa: E402

from swapstream.watermark import luma_of  # noqa: E402
from swapstream.watermark_v2 import LIST_DECODE, SYNC_GATE, WindowDetector  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args()
    if args.frames < 1:
        ap.error(f"--frames must be at least 1, got {args.frames}")
    common = run_fields(cpu_name(), f"python tools/watermark_false_marks.py --frames {args.frames}")
    peaks: list[float] = []
    found = tries = 0
    t0 = time.perf_counter()
    for i, frame in enumerate(varied_unmarked(args.frames)):
        d = WindowDetector()
        d.add(luma_of(frame))
        for t in d.tries():
            tries += 1
            found += int(t.found)
            if t.alignment is not None:
                peaks.append(t.alignment.peak)
        if (i + 1) % 1000 == 0:
            print(f"{i + 1}/{args.frames} frames, {found} false marks, {time.perf_counter() - t0:.0f} s", flush=True)
    p = np.asarray(peaks)
    above = int((p >= SYNC_GATE).sum())
    config = {"frames": args.frames, "tries": tries, "synced_tries": len(peaks), "sync_gate": SYNC_GATE,
              "list_decode": LIST_DECODE, "seconds": round(time.perf_counter() - t0)}
    records = [
        {"metric": "watermark_v2_false_marks_varied_frames", "value": found, "unit": "frames", "stat": "max",
         "config": config, **common},
        {"metric": "watermark_v2_unmarked_tries_past_sync_gate", "value": above, "unit": "tries", "stat": "max",
         "config": config, **common},
        {"metric": "watermark_v2_unmarked_sync_peak_max", "value": round(float(p.max()), 3) if len(p) else None,
         "unit": "standard deviations", "stat": "max", "config": config, **common},
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watermark_false_marks.json").write_text(json.dumps(records, indent=2) + "\n")
    q = np.percentile(p, [50, 99, 99.9]) if len(p) else [float("nan")] * 3
    lines = [f"# Watermark v2 on unmarked pictures ({common['device']}, {common['commit']}, {common['date']})", "",
             f"Command: `{common['command']}`. {args.frames} varied unmarked frames, each its own window, "
             f"read by the shipped detector ({tries} tries: a single frame gets the plain sum only). A try "
             f"whose sync peak passes the gate ({SYNC_GATE} standard deviations) has up to {LIST_DECODE} "
             "distinct folds decoded, each through the CRC-16 and the score gate; below it nothing is decoded.",
             "", "| false marks | tries past the sync gate | sync peak: median | 99th pct | 99.9th pct | highest |",
             "|---|---|---|---|---|---|",
             f"| {found} of {args.frames} | {above} of {len(p)} ({100 * above / max(1, len(p)):.1f}%) | "
             f"{q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | {float(p.max()) if len(p) else float('nan'):.2f} |", ""]
    (args.out / "watermark_false_marks.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
