"""Placement at scale, on paper: the server's own placement policy (runtime.placement.choose) driven
over 1,000 simulated GPUs by 30,000 streams that arrive and leave.

    python tools/placement_sim.py [--gpus 1000] [--streams 30000] [--offered 1.15] [--seed 1]
        [--out docs/benchmarks] [--name placement_sim]

Per-stream costs come from our benchmark records, as the busy share of one GPU's budget a stream
takes (1.0: the load at which the GPU still meets every stream's latency budget):
- serve_streams.json: `serve_streams_{720p,1080p}30_null_within_budget` streams fit one H200 with the
  neural swapper (inswapper_128, one face per frame: `faces_per_s / (n * fps)`), so each costs
  1/that;
- mesh_gpu.json: `mesh_occlusion_gpu_us_per_face_1080p`'s wall time a call (p50, the runtime's mesh
  backend with its default occlusion mask on a 1080p face: what a worker's device thread waits for,
  host-bound, about 26 times its GPU time) times 30 fps.
A GPU is one worker here whose load report is exact (its busy share is the sum of its streams' costs, and
its cost per swapper their mean per swapper;
none of its streams is over budget while that sum stays below 1): the simulator measures the policy,
not the reports' noise. Streams arrive as a Poisson process and live for an exponential time (10
minutes); the offered load (arrival rate x mean life x mean cost) is `--offered` times the GPUs'
capacity (2.0 by default: the 30,000 streams would be running at once if they all fitted, twice what
1,000 GPUs hold), so the cluster fills during the run and then stays full while streams leave and
others take their room. A new stream's arrival phase is unknown when it is placed, as in the server.

Reported: mean GPU utilisation within budget (the time-weighted mean of the GPUs' busy share from the
first refusal on, that is while the cluster is full; the policy never puts a GPU above BUSY_MAX), the
share of arrivals refused (503), and the time one placement takes (the policy's call over every GPU).
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, git_sha  # noqa: E402

from swapstream.runtime.placement import BUSY_MAX, NoRoom, SimWorker, choose  # noqa: E402


def stream_costs(bench: Path) -> dict[str, dict[str, Any]]:
    """Each kind of stream's cost (busy share of one GPU) and where it comes from."""
    serve = json.loads((bench / "serve_streams.json").read_text())
    mesh_gpu = json.loads((bench / "mesh_gpu.json").read_text())
    by = {(r["metric"], r["stat"]): r for r in serve}
    kinds: dict[str, dict[str, Any]] = {}
    for res in ("720p", "1080p"):
        fit = by[(f"serve_streams_{res}30_null_within_budget", "max")]
        n = int(fit["value"])
        faces = by[(f"serve_faces_per_s_{res}30_null_n{n}", "mean")]
        fps = float(faces["config"]["fps"])
        kinds[f"inswapper_{res}30"] = {
            "cost": 1.0 / n, "swapper": "inswapper_128", "faces_per_frame": round(float(faces["value"]) / (n * fps), 2),
            "source": f"serve_streams.json serve_streams_{res}30_null_within_budget = {n} on {fit['device']}"}
    mesh = next(r for r in mesh_gpu if r["metric"] == "mesh_occlusion_gpu_us_per_face_1080p")
    wall = float(mesh["config"]["wall_ms_p50"])
    kinds["mesh_1080p30"] = {"cost": wall * 30 / 1000, "faces_per_frame": 1.0, "swapper": "mesh",
                             "source": f"mesh_gpu.json mesh_occlusion_gpu_us_per_face_1080p wall p50 = {wall} ms "
                                       f"a call on {mesh['device']}, x 30 fps"}
    return kinds


def simulate(gpus: int, streams: int, offered: float, mix: dict[str, float], kinds: dict[str, dict[str, Any]],
             seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    workers = [SimWorker(f"g{i}") for i in range(gpus)]
    for w in workers:
        w.report()
    names = list(mix)
    weights = [mix[k] for k in names]
    mean_cost = sum(kinds[k]["cost"] * mix[k] for k in names) / sum(weights)
    capacity = gpus * BUSY_MAX / mean_cost  # streams the GPUs could hold at BUSY_MAX, packed perfectly
    life = 600.0  # seconds; only the ratio of life to arrival gap matters
    rate = offered * capacity / life
    t = 0.0
    leaving: list[tuple[float, int, SimWorker]] = []
    refused = placed = 0
    place_s: list[float] = []
    refuse_s: list[float] = []
    full_at: float | None = None
    """When the first arrival was refused: the cluster is full from then on, and measured."""
    area = span = 0.0
    busy_total = 0.0
    last = 0.0

    def advance(to: float) -> None:
        nonlocal area, span, last
        if full_at is not None:
            area += busy_total * (to - last)
            span += to - last
        last = to

    def held(w: SimWorker) -> int:
        return len(w.streams)

    for sid in range(streams):
        t += rng.expovariate(rate)
        while leaving and leaving[0][0] <= t:
            end, gone, w = heapq.heappop(leaving)
            advance(end)
            busy_total -= w.streams.pop(gone)[0]
            w.report()
        advance(t)
        kind = rng.choices(names, weights)[0]
        cost = kinds[kind]["cost"]
        t0 = time.perf_counter()
        try:
            # The server knows a new stream's swapper (its create request), not its resolution.
            w = choose(workers, held, 64, swapper=kinds[kind]["swapper"])
        except NoRoom:
            w = None
        (place_s if w is not None else refuse_s).append(time.perf_counter() - t0)
        if w is None:
            refused += 1
            if full_at is None:
                full_at = last = t
            continue
        placed += 1
        w.streams[sid] = (cost, rng.random(), kinds[kind]["swapper"])
        busy_total += cost
        w.report()
        heapq.heappush(leaving, (t + rng.expovariate(1.0 / life), sid, w))
    over = [w.name for w in workers if sum(c for c, _, _ in w.streams.values()) > 1.0]
    ms = sorted(x * 1e3 for x in place_s)
    no = sorted(x * 1e3 for x in refuse_s) or [0.0]
    return {"gpus": gpus, "streams": streams, "offered": offered, "mix": mix, "mean_cost": round(mean_cost, 4),
            "simulated_s": round(t, 1), "full_from_s": round(full_at, 1) if full_at is not None else None,
            "utilisation_mean": round(area / span / gpus, 4) if span else None,
            "utilisation_at_end": round(busy_total / gpus, 4),
            "gpus_over_budget_at_end": len(over), "placed": placed, "refused": refused,
            "refused_pct": round(100 * refused / streams, 2), "concurrent_at_end": len(leaving),
            "place_ms_mean": round(statistics.fmean(ms), 4), "place_ms_p50": round(ms[len(ms) // 2], 4),
            "place_ms_p99": round(ms[int(len(ms) * 0.99)], 4), "place_ms_max": round(ms[-1], 4),
            # A refusal writes every GPU's reason into the 503: 1,000 lines, a slower path.
            "refuse_ms_p50": round(no[len(no) // 2], 4), "refuse_ms_p99": round(no[int(len(no) * 0.99)], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=30000)
    ap.add_argument("--offered", type=float, default=2.0,
                    help="offered load as a multiple of the GPUs' capacity (2.0: twice what fits, so the "
                         "cluster fills within the run and stays full while streams leave and arrive)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bench", type=Path, default=REPO / "docs" / "benchmarks",
                    help="the folder of the benchmark records the costs come from")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--name", default="placement_sim")
    args = ap.parse_args()
    if args.gpus < 1 or args.streams < 1 or not 0 < args.offered <= 10:
        sys.exit("error: --gpus and --streams must be at least 1 and --offered above 0 and at most 10")
    try:
        kinds = stream_costs(args.bench)
    except (OSError, KeyError, StopIteration, ValueError) as e:
        sys.exit(f"error: the benchmark records in '{args.bench}' lack what the costs come from ({e!r}): "
                 f"give the repository's docs/benchmarks with --bench")
    mix = {"inswapper_720p30": 0.4, "inswapper_1080p30": 0.4, "mesh_1080p30": 0.2}
    res = simulate(args.gpus, args.streams, args.offered, mix, kinds, args.seed)
    if res["utilisation_mean"] is None:
        # The utilisation is measured while the cluster is full, and it never filled.
        sys.exit(f"error: {args.streams} streams never filled {args.gpus} GPUs at --offered {args.offered}: "
                 f"give more streams (--streams) or fewer GPUs (--gpus)")
    command = "python tools/placement_sim.py " + " ".join(sys.argv[1:])
    common = {"device": cpu_name(), "commit": git_sha(), "date": datetime.date.today().isoformat(),
              "command": command, "config": {k: res[k] for k in ("gpus", "streams", "offered", "mix", "mean_cost")}
              | {"costs": kinds}}
    recs = [{"metric": "placement_sim_utilisation_within_budget", "value": res["utilisation_mean"], "unit": "share",
             "stat": "mean", **common},
            {"metric": "placement_sim_place_ms", "value": res["place_ms_mean"], "unit": "ms", "stat": "mean", **common},
            {"metric": "placement_sim_place_ms", "value": res["place_ms_p99"], "unit": "ms", "stat": "p99", **common},
            {"metric": "placement_sim_place_ms", "value": res["place_ms_p50"], "unit": "ms", "stat": "p50", **common},
            {"metric": "placement_sim_refused", "value": res["refused_pct"], "unit": "%", "stat": "mean", **common},
            {"metric": "placement_sim_gpus_over_budget", "value": res["gpus_over_budget_at_end"], "unit": "GPUs",
             "stat": "max", **common}]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(recs, indent=1) + "\n")
    lines = [f"# Placement simulator ({common['device']}, {common['commit']}, {common['date']})", "",
             f"Command: `{command}`", "",
             f"The server's placement policy (`runtime.placement.choose`, as `serve --workers` and `serve --ray` "
             f"call it) over {res['gpus']} simulated GPUs, {res['streams']} streams arriving and leaving, offered "
             f"{res['offered']}x what the GPUs hold. Costs per stream (busy share of one GPU's budget):", ""]
    lines += [f"- {k}: {v['cost']:.4f} ({v['faces_per_frame']} faces per frame; {v['source']}), "
              f"{int(mix[k] * 100)}% of the streams" for k, v in kinds.items()]
    lines += ["", "| figure | value |", "|---|---|",
              f"| mean GPU utilisation within budget (from the first refusal, at {res['full_from_s']} s of "
              f"{res['simulated_s']} s, on) | {res['utilisation_mean']:.1%} |",
              f"| GPUs over budget at the end | {res['gpus_over_budget_at_end']} |",
              f"| arrivals refused (503) | {res['refused_pct']}% |",
              f"| time per placement, mean / p50 / p99 / max | {res['place_ms_mean']} / {res['place_ms_p50']} / "
              f"{res['place_ms_p99']} / {res['place_ms_max']} ms |",
              f"| time per refusal (the 503 with each GPU's reason), p50 / p99 | {res['refuse_ms_p50']} / "
              f"{res['refuse_ms_p99']} ms |",
              f"| streams running at the end | {res['concurrent_at_end']} |", "",
              "Timed on a shared 2-core machine while other work ran: the p99 and max carry its scheduling "
              "noise.", "",
              "What this does not model: the reports' noise and delay (the server reads them every second; "
              "streams placed since count at the worker's mean cost), faces per frame that change within a "
              "stream, MPS sharing between several workers of one GPU (one worker per GPU here), and the "
              "failure of nodes."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(res), flush=True)
    print(f"wrote {args.out / args.name}.json and .md")


if __name__ == "__main__":
    main()
