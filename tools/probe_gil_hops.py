"""What one hand-over of work between the runtime's threads costs while other threads run Python.

    python tools/probe_gil_hops.py [--trips 300] [--busy 0,1,3] [--intervals-ms 5,1,0.5,0.2,0.1]
        [--out DIR --name gil_hops]

A diagnostic, not a benchmark of the product: it times the runtime's own `DynamicBatcher` (the
path every GPU frame takes to its analysis: the stream's task submits, the batcher's task wakes,
the executor thread runs the call, the loop wakes again) with a call that does nothing, beside
0 or more threads that run pure Python without pause, at several GIL switch intervals
(`runtime.switch_interval_ms`). Each trip's wait is what a frame would pay on top of its work when
the GIL is that busy. Prints one line per case and, with --out, writes `<out>/<name>.json` and
`.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from swapstream.runtime.batcher import DynamicBatcher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import git_sha  # noqa: E402

WARM_TRIPS = 20
"""Trips left out of the figures: the threads and the loop settle first."""


def spin(stop: threading.Event) -> None:
    """Python without pause (no call that releases the GIL), until `stop`."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


async def trips(n: int) -> list[float]:
    """`n` round trips through a one-stream batcher and its executor thread, in milliseconds."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="probe-analysis")
    batcher = DynamicBatcher(lambda _key, items: [None for _ in items], max_batch=8, max_wait=0.004,
                             executor=pool, sources=lambda: ["probe"])
    batcher.start()
    loop = asyncio.get_running_loop()
    out = []
    try:
        for _ in range(n + WARM_TRIPS):
            t0 = time.perf_counter()
            await batcher.submit("probe", "analyse", 1, loop.time() + 1.0, None)
            out.append((time.perf_counter() - t0) * 1e3)
    finally:
        await batcher.close()
        pool.shutdown()
    return out[WARM_TRIPS:]


def case(busy: int, interval_ms: float, n: int) -> dict[str, Any]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval_ms / 1e3)
    stop = threading.Event()
    spinners = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
    for t in spinners:
        t.start()
    try:
        ms = sorted(asyncio.run(trips(n)))
    finally:
        stop.set()
        for t in spinners:
            t.join()
        sys.setswitchinterval(before)
    return {"busy_threads": busy, "switch_interval_ms": interval_ms, "trips": n,
            "p50_ms": round(statistics.median(ms), 3), "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
            "mean_ms": round(statistics.fmean(ms), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", type=int, default=300)
    ap.add_argument("--busy", default="0,1,3", help="numbers of threads running Python beside the trips")
    ap.add_argument("--intervals-ms", default="5,1,0.5,0.2,0.1", help="GIL switch intervals to try")
    ap.add_argument("--out", type=Path, default=None, help="write the record into this folder")
    ap.add_argument("--name", default="gil_hops")
    args = ap.parse_args()
    try:
        busy = [int(b) for b in args.busy.split(",")]
        intervals = [float(i) for i in args.intervals_ms.split(",")]
    except ValueError:
        sys.exit("error: --busy takes whole numbers and --intervals-ms numbers, comma-separated (e.g. 0,1,3 and 5,1)")
    if args.trips < 1 or min(busy) < 0 or min(intervals) <= 0:
        sys.exit("error: --trips must be at least 1, --busy at least 0 and --intervals-ms above 0")
    cases = []
    for b in busy:
        for i in intervals:
            c = case(b, i, args.trips)
            cases.append(c)
            print(f"{b} busy thread(s), switch interval {i:g} ms: trip p50 {c['p50_ms']:.3f} ms, "
                  f"p90 {c['p90_ms']:.3f}, mean {c['mean_ms']:.3f}", flush=True)
    if args.out is not None:
        rec = {"commit": git_sha() or "unknown", "date": datetime.date.today().isoformat(),
               "device": f"CPU ({os.cpu_count()} cores), Python {sys.version.split()[0]}",
               "command": "python tools/probe_gil_hops.py " + " ".join(sys.argv[1:]), "cases": cases}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(rec, indent=1) + "\n")
        lines = [f"# One hand-over between the runtime's threads, beside threads that run Python "
                 f"({rec['device']}, {rec['commit']}, {rec['date']})", "",
                 f"Command: `{rec['command']}`. A diagnostic: one `DynamicBatcher` trip (submit, the executor "
                 "thread's call, the result back in the loop) with a call that does nothing, beside threads "
                 "that run pure Python without pause.", "",
                 "| threads running Python | switch interval ms | trip p50 ms | p90 ms | mean ms |", "|---|---|---|---|---|"]
        lines += [f"| {c['busy_threads']} | {c['switch_interval_ms']:g} | {c['p50_ms']} | {c['p90_ms']} | {c['mean_ms']} |"
                  for c in cases]
        (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
