"""`serve --ray` on a local Ray cluster, on the CPU, with real peers on loopback.

The cluster test runs the cluster benchmark (tools/bench_cluster.py), which starts what a user would:
a Ray cluster of 3 nodes (`ray.cluster_utils.Cluster`, each with 3 `swapstream_slot` standing for its
GPU slots), nginx-rtmp with an ffmpeg publisher per stream, and `swapstream serve --ray ADDRESS
--workers 6` from the command line. What a user of the API must see: no stream placed while no
worker's models verify, and a 503 saying so; 4 live streams (RTMP in, mesh swapper, RTMP out)
placed across at least 2 nodes, each output carrying the watermark; then a node removed, its
streams out again from another node within 10 s (same output URLs, watermark in them), and the API
showing the new placement.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from swapstream.runtime.placement import (BUSY_MAX, FALLBACK_COST, Headroom, NoRoom, choose, crowding, headroom,
                                          projected_busy, refusal, stream_cost)
from swapstream.runtime.workers import merge_metrics

REPO = Path(__file__).resolve().parents[2]


def _missing() -> str:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "needs Ray (pip install '.[test]' installs it)"
    if shutil.which("ffmpeg") is None or not Path("/usr/lib/nginx/modules/ngx_rtmp_module.so").exists():
        return "needs ffmpeg and nginx with libnginx-mod-rtmp (.ci/run installs them)"
    return ""


MISSING = _missing()


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=MISSING)
def test_a_ray_cluster_places_swaps_and_survives_the_loss_of_a_node(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "tools" / "bench_cluster.py"), "--out", str(tmp_path),
                          "--name", "ci"], cwd=REPO, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    s = json.loads(res.stdout.strip().splitlines()[-1])
    # No node had its models: every worker said why, and a create found room nowhere.
    gate = s["models_gate"]
    assert gate["create_status"] == 503 and "its models did not verify" in gate["create_error"]
    assert len(gate["refusals"]) == 6 and all("not found in" in r for r in gate["refusals"].values())
    assert s["models_verified_s"] < 10
    # Four streams across at least two nodes, each output swapped and marked.
    before = s["nodes_before"]
    assert len(before) >= 2 and sorted(x for v in before.values() for x in v) == ["c0", "c1", "c2", "c3"]
    assert s["watermark_before"] == {"c0": True, "c1": True, "c2": True, "c3": True}
    # One /metrics for the cluster: each stream's samples say which node and worker run it.
    assert {sid: v["node"] for sid, v in s["metrics_before"].items()} == {
        sid: node for node, sids in before.items() for sid in sids}
    assert all(v["worker"].startswith("w") for v in s["metrics_before"].values())
    # A node removed: its streams out again from another node within 10 s, the same URLs marked.
    moved = s["moved"]
    victim = next(n for n, v in before.items() if v == moved)
    assert moved and all(t <= 10.0 for t in s["failover_s"].values()), s["failover_s"]
    assert s["watermark_after"] == {sid: True for sid in moved}
    # The API shows the new placement: no stream on the removed node, all four running.
    assert victim not in s["nodes_after"]
    assert sorted(x for v in s["nodes_after"].values() for x in v) == ["c0", "c1", "c2", "c3"]
    assert all(v["state"] == "running" and v["node"] != victim for v in s["streams_after"].values())
    # Ray restarted the removed node's actors on the others: every worker is up again.
    assert all(w["state"] == "ready" and w["node"] != victim for w in s["workers_after"]), s["workers_after"]
    records = json.loads((tmp_path / "ci.json").read_text())
    assert {r["metric"] for r in records} == {"cluster_failover_s", "cluster_place_ms"}
    assert all(r["command"].startswith("python tools/bench_cluster.py") for r in records)
    assert "| cluster_failover_s | max |" in (tmp_path / "ci.md").read_text()


def test_a_ray_address_that_does_not_answer_is_one_line_and_exit_2(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", "--ray",
                          f"127.0.0.1:{port}", "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --ray 127.0.0.1:{port}: nothing answers there")
    assert "ray start --head" in lines[0] and "Traceback" not in res.stderr


@pytest.mark.parametrize("args, says", [
    (["--ray", "127.0.0.1:1"], "--ray runs the streams on worker actors: give how many with --workers N"),
    (["--ray", "127.0.0.1:1", "--workers", "2", "--ray-resource", "slot=-1"], "--ray-resource 'slot=-1': give NAME=AMOUNT"),
    (["--ray", "nowhere", "--workers", "2"], "--ray 'nowhere' is not an address"),
    (["--ray-resource", "slot=1"], "--ray-resource is for --ray"),
])
def test_bad_ray_options_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    res = subprocess.run([sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", *args],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], lines


def _worker(name: str, **report: object) -> SimpleNamespace:
    return SimpleNamespace(name=name, state="ready", headroom=headroom(report))


def test_placement_goes_by_load_then_phase_then_streams() -> None:
    a = _worker("a", busy=0.31, streams=2, phases={"x": 0.0, "y": 0.5})
    b = _worker("b", busy=0.34, streams=2, phases={"z": 0.25, "u": 0.75})
    c = _worker("c", busy=0.62, streams=4)
    held = {"a": 2, "b": 2, "c": 4}
    # Unknown phase: a and b are equally loaded (0.3), a comes first.
    assert choose([a, b, c], lambda w: held[w.name], 8).name == "a"
    # A moved stream that arrives at 0.5 of its period collides with y on a, with nothing on b.
    assert crowding(a.headroom.phases, 0.52) == 1 and crowding(b.headroom.phases, 0.52) == 0
    assert choose([a, b, c], lambda w: held[w.name], 8, phase=0.52).name == "b"
    # The phase circle wraps: 0.98 is near 0.0.
    assert crowding((0.0,), 0.98) == 1


def test_a_burst_spreads_over_workers_whose_reports_are_stale() -> None:
    # Eight workers: one reported idle (its streams just went), the others reported 0.6 busy with
    # two streams each (0.3 a stream) and the streams placed since are not in any report yet.
    idle = _worker("w0", busy=0.0, streams=0)
    others = [_worker(f"w{i}", busy=0.6, streams=0) for i in range(1, 8)]
    workers = [idle, *others]
    assert stream_cost(workers) == FALLBACK_COST  # no report holds a stream: nothing to judge by
    loaded = [_worker(f"v{i}", busy=0.3 * (i % 3), streams=i % 3) for i in range(8)]
    assert stream_cost(loaded) == pytest.approx(0.3)
    # With the reports' cost of 0.3 a stream, the idle worker takes three streams, not all of them.
    workers = [_worker("w0", busy=0.0, streams=0)] + [_worker(f"w{i}", busy=0.3, streams=1) for i in range(1, 8)]
    held = {w.name: w.headroom.reported_streams for w in workers}
    placed = []
    for _ in range(10):
        w = choose(workers, lambda w: held[w.name], 8)
        held[w.name] += 1
        placed.append(w.name)
    assert placed.count("w0") == 3, placed
    assert max(held.values()) == 3 and min(held.values()) == 2, held


def test_streams_still_starting_are_not_taken_as_free() -> None:
    # A report of 3 streams of which none has run long enough for the busy share to hold it: its
    # 0.02 is not a stream's cost; the other workers' settled streams (0.25 each) are.
    starting = _worker("s", busy=0.02, streams=3, settled=0)
    steady = [_worker(f"w{i}", busy=0.5, streams=2, settled=2) for i in range(3)]
    assert starting.headroom.costed == 0 and starting.headroom.per_stream == 0.0
    assert stream_cost([starting, *steady]) == pytest.approx(0.25)
    # Projected: 0.02 + 0.25 x (3 + 1) = 1.02 for the starting worker: over BUSY_MAX, it takes none.
    held = {"s": 3, "w0": 2, "w1": 2, "w2": 2}
    assert choose([starting, *steady], lambda w: held[w.name], 8).name == "w0"
    assert "s: device thread busy 2% of the time, 102% with one more stream" in \
        refusal(starting, 3, 8, stream_cost([starting, *steady]))


def test_placement_refuses_with_every_reason() -> None:
    full = _worker("full", busy=0.9, streams=3)  # 0.3 a stream: a fourth would pass BUSY_MAX
    late = _worker("late", busy=0.2, streams=1, p99_over_budget={"s9": 1.3})
    bare = _worker("bare", models="built-in model 'face_landmark.tflite' not found in '/m'")
    capped = _worker("capped", streams=2, max_streams=2)
    with pytest.raises(NoRoom) as e:
        choose([full, late, bare, capped], lambda w: w.headroom.reported_streams, 8)
    assert e.value.reasons == [
        "full: device thread busy 90% of the time, 120% with one more stream",
        "late: stream s9 is over its latency budget (p99 at 130% of it)",
        "bare: its models did not verify (built-in model 'face_landmark.tflite' not found in '/m')",
        "capped: 2 streams, its most (runtime.max_streams 2)"]
    # Streams placed since the last report count at the worker's own mean cost.
    ok = _worker("ok", busy=0.5, streams=2)
    assert choose([ok], lambda w: 2, 8).name == "ok"
    with pytest.raises(NoRoom):
        choose([ok], lambda w: 3, 8)  # 0.5 + 0.25 * 2 > BUSY_MAX
    assert BUSY_MAX < 1.0 and Headroom().per_stream == 0.0 and Headroom().costed == 0


def test_a_new_stream_is_charged_what_its_swapper_costs() -> None:
    # n: 28 neural streams, 0.03 each. m: 2 neural streams (0.07 each) and 3 mesh streams (0.22
    # each), 0.16 a stream on average.
    n = _worker("n", busy=0.85, streams=28, costs={"inswapper_128": 0.03})
    m = _worker("m", busy=0.80, streams=5, costs={"inswapper_128": 0.07, "mesh": 0.22})
    held = {"n": 28, "m": 5, "f": 6}
    # A neural stream: n would pass BUSY_MAX only at 0.96 (so it takes one at 0.88); m takes one at
    # its neural cost (0.87), where its mean per stream (0.96) refused it before costs per swapper.
    assert choose([n, m], lambda w: held[w.name], 64, swapper="inswapper_128").name == "m"
    assert projected_busy(m.headroom, 5, 0.05, "inswapper_128") == pytest.approx(0.87)
    assert projected_busy(m.headroom, 5, 0.05) == pytest.approx(0.96)  # swapper unknown: its mean
    # A mesh stream: m's report says one costs 0.22, so m refuses (1.02), and n, which runs none, is
    # charged that too (1.07), where its own mean (0.03) would have let it take one.
    with pytest.raises(NoRoom) as e:
        choose([n, m], lambda w: held[w.name], 64, swapper="mesh")
    assert e.value.reasons == ["n: device thread busy 85% of the time, 107% with one more stream",
                               "m: device thread busy 80% of the time, 102% with one more stream"]
    assert choose([n], lambda w: held[w.name], 64, swapper="mesh").name == "n"  # no report knows mesh
    # A worker without a report: the streams placed on it since at the reports' mean per stream, the
    # new one at what the reports say its swapper costs.
    fresh = _worker("f", busy=0.0, streams=0)
    mean = stream_cost([n, m])
    assert mean == pytest.approx((0.85 / 28 + 0.80 / 5) / 2)
    assert choose([n, m, fresh], lambda w: held[w.name], 64, swapper="mesh").name == "f"
    assert projected_busy(fresh.headroom, 6, mean, "mesh", 0.22) == pytest.approx(6 * mean + 0.22)
    assert projected_busy(fresh.headroom, 6, mean, "mesh", None) == pytest.approx(7 * mean)
    assert refusal(fresh, 6, 64, mean, "mesh", 0.22) is None
    assert "with one more stream" in str(refusal(fresh, 8, 64, mean, "mesh", 0.22))  # 0.98


def test_a_worker_reports_each_swappers_cost_by_its_share_of_the_swap_thread() -> None:
    from swapstream.runtime.worker import swapper_costs

    # 0.6 busy. Two mesh streams took 0.3 and 0.2 of the swap thread's time, two neural streams 0.1
    # each; "new" (0.3) is still starting, "noface" ran no batch: neither says what its swapper costs.
    shares = {"m1": 0.3, "m2": 0.2, "i1": 0.1, "i2": 0.1, "new": 0.3}
    settled = {"m1": "mesh", "m2": "mesh", "i1": "inswapper_128", "i2": "inswapper_128", "noface": "simswap_256"}
    costs = swapper_costs(0.6, shares, settled)
    assert costs == {"mesh": pytest.approx(0.15), "inswapper_128": pytest.approx(0.06)}
    assert swapper_costs(0.6, {}, {"m1": "mesh"}) == {}


def test_cluster_metrics_carry_node_and_worker() -> None:
    text = merge_metrics([({"node": "n1", "worker": "w0"}, "# TYPE g gauge\ng{stream=\"s\"} 1.0\n"),
                          ({"node": "n2", "worker": "w1"}, "# TYPE g gauge\ng{stream=\"t\"} 2.0\n")])
    assert text.splitlines() == ["# TYPE g gauge", 'g{node="n1",worker="w0",stream="s"} 1.0',
                                 'g{node="n2",worker="w1",stream="t"} 2.0']


def test_the_placement_simulator_fills_gpus_within_budget(tmp_path: Path) -> None:
    """tools/placement_sim.py at small scale: the real policy, costs from docs/benchmarks, GPUs filled
    to at least 85% while full, none over budget, and its records written."""
    res = subprocess.run([sys.executable, str(REPO / "tools" / "placement_sim.py"), "--gpus", "20", "--streams",
                          "1500", "--out", str(tmp_path), "--name", "sim"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[0])
    assert out["full_from_s"] is not None and out["refused"] > 0  # it did fill up
    assert out["utilisation_mean"] >= 0.85 and out["gpus_over_budget_at_end"] == 0, out
    records = {(r["metric"], r["stat"]): r for r in json.loads((tmp_path / "sim.json").read_text())}
    assert records[("placement_sim_utilisation_within_budget", "mean")]["value"] == out["utilisation_mean"]
    assert "serve_streams.json" in json.dumps(records[("placement_sim_place_ms", "mean")]["config"]["costs"])


def test_a_stream_s_arrival_phase_is_where_its_frames_land_in_a_period() -> None:
    from collections import deque

    from swapstream.runtime.stream import StreamPipeline

    def phase(times: list[float]) -> float | None:
        # The method reads the stream's last arrival times alone.
        return StreamPipeline.arrival_phase(SimpleNamespace(arrivals=deque(times)))  # type: ignore[arg-type]

    assert phase([0.1 * k + 0.03 for k in range(1000, 1016)]) == pytest.approx(0.3, abs=0.01)
    # Jitter around the period's start averages to 0 on the circle, not to 0.5.
    jittered = [0.1 * k + (0.002 if k % 2 else -0.002) for k in range(1000, 1016)]
    got = phase(jittered)
    assert got is not None and min(got, 1 - got) < 0.05
    assert phase([1.0, 1.1, 1.2]) is None  # too few frames to say
