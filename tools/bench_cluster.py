"""`swapstream serve --ray` on a local Ray cluster: placement across nodes and the failover of a node.

    python tools/bench_cluster.py [--nodes 3] [--slots 3] [--workers 6] [--streams 4] [--fps 10]
        [--size 320x240] [--out docs/benchmarks] [--name cluster]

What it does, with real peers on this machine:
- starts a Ray cluster of `--nodes` nodes (`ray.cluster_utils.Cluster`: one raylet each), every node
  with `--slots` of the custom resource `swapstream_slot`, standing for its GPU slots;
- starts nginx-rtmp and one ffmpeg publisher per stream (a looping H.264 clip of a moving portrait);
- starts `swapstream serve --no-webrtc --ray ADDRESS --workers W --ray-resource swapstream_slot=1`,
  the product as users run it, with an empty models folder: checks that every worker is refused with
  the reason and that a create is a 503 that says it, then installs the models and waits until the
  workers verify them and take streams;
- creates the streams through the control API (RTMP in from the publishers, the mesh swapper, RTMP
  out to nginx) with a source face, times each create (`cluster_place_ms`: the request, placement
  and the stream's start on its actor's node), waits for swapped frames out of each, and pulls each
  output back to find the watermark;
- removes a node that holds streams (not the head: the cluster's driver side lives there) and times
  until each of its streams puts out frames again from another node (`cluster_failover_s`), checks
  that the API shows the new placement, and pulls the moved streams' outputs (same URLs) again for
  the watermark.
Results: `<out>/<name>.json` (records as in docs/benchmarks) and `<out>/<name>.md`; the last line on
standard output is the run's summary as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_streams import Api  # noqa: E402  (the stream benchmark's API client)
from benchlib import cpu_name, git_sha  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers.wait import until as wait_until  # noqa: E402

RESOURCE = "swapstream_slot"


def until(what: str, timeout: float, check: Callable[[], Any], every: float = 0.1) -> Any:
    return wait_until(what, timeout, check, every, fail=SystemExit)


def face_png() -> bytes:
    import cv2

    from swapstream.demo import astronaut

    ok, buf = cv2.imencode(".png", cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def watermarks(urls: dict[str, str]) -> dict[str, bool]:
    """Each RTMP output pulled back (two seconds of it) and checked for the invisible mark, together."""
    from swapstream.verify import verify

    with ThreadPoolExecutor(len(urls)) as pool:
        found = {sid: pool.submit(lambda u: verify(u, max_frames=20).found, url) for sid, url in urls.items()}
        return {sid: f.result() for sid, f in found.items()}


def streams_by_node(api: Api) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in api.call("GET", "/api/workers")[1]["workers"]:
        if w["node"]:
            out.setdefault(w["node"], []).extend(w["streams"])
    return {k: sorted(v) for k, v in out.items() if v}


def frames_out_labels(api: Api) -> dict[str, dict[str, str]]:
    """The server's one /metrics: each stream's `swapstream_frames_out` sample's node and worker."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = api.call("GET", "/metrics")
    if status != 200:
        raise SystemExit(f"error: GET /metrics answered {status}: {text}")
    return {s.labels["stream"]: {"node": s.labels.get("node", ""), "worker": s.labels.get("worker", "")}
            for f in text_string_to_metric_families(text) if f.name == "swapstream_frames_out"
            for s in f.samples if s.name == "swapstream_frames_out_total"}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    from swapstream.engines.builtin import BUILTIN_MODELS, builtin_model_path
    from swapstream.live.nginx import NginxRtmp, free_port

    w, h = args.size
    media = work / "media"
    media.mkdir()
    from swapstream.demo import grace_hopper, write_demo_clip

    write_demo_clip(media / "clip.mp4", grace_hopper(), seconds=6.0, fps=args.fps, size=(w, h),
                    keyframe_s=1.0)
    models = work / "models"
    models.mkdir()
    from swapstream.errors import ModelMissingError

    try:
        installed = [builtin_model_path(name) for name in BUILTIN_MODELS]  # `swapstream setup` put them here
    except ModelMissingError as e:
        raise SystemExit(f"error: {e}") from None
    summary: dict[str, Any] = {}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {RESOURCE: args.slots}, "include_dashboard": False})
    procs: list[subprocess.Popen[bytes]] = []
    nginx = None
    serve = None
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=1, resources={RESOURCE: args.slots})
        cluster.wait_for_nodes()
        nginx = NginxRtmp(work / "nginx").start()
        port = free_port()
        api = Api(f"http://127.0.0.1:{port}", secrets.token_urlsafe(24))
        (work / "token").write_text(api.token)
        cmd = [sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", "--host", "127.0.0.1",
               "--port", str(port), "--ray", cluster.address, "--workers", str(args.workers),
               "--ray-resource", f"{RESOURCE}=1", "--ray-cpus", "0", "--media-root", str(media),
               "--api-token-file", str(work / "token"), "--config", "multi_stream",
               "--set", "swapper=mesh", "--set", "runtime.budget_ms=5000",
               "--set", f"runtime.allowed_ports=[{nginx.port}]", "--set", f"models_dir={models}"]
        print("serve:", " ".join(cmd[2:]), flush=True)
        serve = subprocess.Popen(cmd)

        def ready() -> bool:
            if serve.poll() is not None:
                raise SystemExit(f"error: swapstream serve exited with code {serve.returncode} while starting")
            try:
                workers = api.call("GET", "/api/workers", timeout=5)
            except OSError:
                return False
            return workers[0] == 200 and all(x["state"] == "ready" for x in workers[1]["workers"])

        until("every worker actor to be ready", 180, ready, every=0.5)
        # A node without the models takes no stream, and says why; a create finds room nowhere.
        until("the workers' first load reports", 20, lambda: all(
            x["refusal"] for x in api.call("GET", "/api/workers")[1]["workers"]))
        gate = {x["name"]: x["refusal"] for x in api.call("GET", "/api/workers")[1]["workers"]}
        status, info = api.call("POST", "/api/streams", {"id": "early", "input": {"file": "clip.mp4", "loop": True},
                                                         "outputs": [{"type": "null"}]})
        summary["models_gate"] = {"refusals": gate, "create_status": status, "create_error": info.get("error")}
        for path in installed:
            shutil.copy(path, models / path.name)
        t_models = time.monotonic()
        until("the workers to verify the models", 20, lambda: not any(
            x["refusal"] for x in api.call("GET", "/api/workers")[1]["workers"]))
        summary["models_verified_s"] = round(time.monotonic() - t_models, 2)

        base = f"rtmp://127.0.0.1:{nginx.port}/live"
        ids = [f"c{i}" for i in range(args.streams)]
        for sid in ids:
            procs.append(subprocess.Popen(
                ["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-stream_loop", "-1", "-i",
                 str(media / "clip.mp4"), "-c", "copy", "-f", "flv", f"{base}/in-{sid}"],
                stdin=subprocess.DEVNULL))
        time.sleep(1.0)  # publishers connected before the workers pull
        face = face_png()
        place_ms = []
        for sid in ids:
            t = time.perf_counter()
            status, info = api.call("POST", "/api/streams", {
                "id": sid, "input": {"url": f"{base}/in-{sid}", "reconnect_seconds": 10.0},
                "outputs": [{"type": "rtmp", "url": f"{base}/out-{sid}"}], "swapper": "mesh"})
            place_ms.append((time.perf_counter() - t) * 1e3)
            if status != 201:
                raise SystemExit(f"error: creating stream {sid} failed: {status} {info}")
            status, info = api.call("PUT", f"/api/streams/{sid}/source", raw=face, ctype="image/png")
            if status != 200:
                raise SystemExit(f"error: setting the face of {sid} failed: {status} {info}")
        summary["place_ms"] = [round(x, 1) for x in place_ms]

        def swapping(sids: list[str]) -> Callable[[], bool]:
            def check() -> bool:
                infos = [api.call("GET", f"/api/streams/{s}")[1] for s in sids]
                return all(i.get("state") == "running" and i.get("faces_swapped", 0) > 0 for i in infos)
            return check

        until("swapped frames out of every stream", 90, swapping(ids), every=0.5)
        before = streams_by_node(api)
        summary["nodes_before"] = before
        summary["watermark_before"] = watermarks({sid: f"{base}/out-{sid}" for sid in ids})
        summary["metrics_before"] = frames_out_labels(api)

        head = cluster.head_node.node_id
        victim_id = max((n for n in before if n != head), key=lambda n: len(before[n]), default=None)
        if victim_id is None:
            raise SystemExit(f"error: every stream is on the head node ({before}); nothing to fail over")
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == victim_id)
        moved = before[victim_id]
        counts = {sid: api.call("GET", f"/api/streams/{sid}")[1]["frames_out"] for sid in moved}
        t0 = time.monotonic()
        summary["load_average_1m"] = round(os.getloadavg()[0], 1)
        cluster.remove_node(victim)
        back: dict[str, float] = {}
        placed: dict[str, float] = {}

        def out_again() -> bool:
            for sid in moved:
                if sid in back:
                    continue
                status, info = api.call("GET", f"/api/streams/{sid}", timeout=10)
                if status == 200 and info.get("node") not in (None, victim_id):
                    placed.setdefault(sid, time.monotonic() - t0)
                # Its new worker's count starts again from 0: frames out there, on another node.
                if status == 200 and info.get("node") not in (None, victim_id) and info.get("frames_out", 0) > 0:
                    back[sid] = time.monotonic() - t0
            return len(back) == len(moved)

        until("the removed node's streams to put out frames again from another node", 60, out_again, every=0.05)
        summary["failover_s"] = {sid: round(v, 2) for sid, v in back.items()}
        # The part of it until the API showed the stream on its new worker (the death seen, the
        # stream placed and created there); the rest is its input opened and its first frames out.
        summary["failover_placed_s"] = {sid: round(v, 2) for sid, v in placed.items()}
        summary["moved"] = moved
        summary["frames_out_before_move"] = counts
        until("swapped frames out of the moved streams", 60, swapping(moved), every=0.5)
        after = streams_by_node(api)
        summary["nodes_after"] = after
        summary["watermark_after"] = watermarks({sid: f"{base}/out-{sid}" for sid in moved})
        until("Ray to restart the removed node's actors on the other nodes", 120, ready, every=0.5)
        summary["restarted_s"] = round(time.monotonic() - t0, 2)
        summary["workers_after"] = [{k: x[k] for k in ("name", "node", "state", "streams", "crashes")}
                                    for x in api.call("GET", "/api/workers")[1]["workers"]]
        _, listed = api.call("GET", "/api/streams")
        summary["streams_after"] = {s["id"]: {"state": s["state"], "node": s.get("node")} for s in listed["streams"]}
        for sid in ids:
            api.call("DELETE", f"/api/streams/{sid}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if serve is not None:
            serve.terminate()
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                serve.kill()
        if nginx is not None:
            nginx.stop()
        cluster.shutdown()
    return summary


def records(s: dict[str, Any], args: argparse.Namespace, command: str) -> list[dict[str, Any]]:
    common = {"device": cpu_name(), "commit": git_sha(), "date": datetime.date.today().isoformat(),
              "command": command, "load_average_1m": s["load_average_1m"]}
    cfg = {"nodes": args.nodes, "slots_per_node": args.slots, "workers": args.workers, "streams": args.streams,
           "size": f"{args.size[0]}x{args.size[1]}", "fps": args.fps, "swapper": "mesh", "input": "rtmp",
           "output": "rtmp", "moved": len(s["moved"])}
    fail = list(s["failover_s"].values())
    return [
        {"metric": "cluster_failover_s", "value": max(fail), "unit": "s", "stat": "max", "config": cfg, **common},
        {"metric": "cluster_failover_s", "value": round(statistics.median(fail), 2), "unit": "s", "stat": "p50",
         "config": cfg, **common},
        {"metric": "cluster_place_ms", "value": round(statistics.median(s["place_ms"]), 1), "unit": "ms",
         "stat": "p50", "config": cfg, **common},
        {"metric": "cluster_place_ms", "value": round(max(s["place_ms"]), 1), "unit": "ms", "stat": "max",
         "config": cfg, **common},
    ]


def markdown(s: dict[str, Any], recs: list[dict[str, Any]]) -> str:
    c = recs[0]
    lines = [f"# swapstream serve --ray on a local Ray cluster ({c['device']}, {c['commit']}, {c['date']})", "",
             f"Command: `{c['command']}`", "",
             f"{c['config']['nodes']} Ray nodes on one machine (`ray.cluster_utils.Cluster`), "
             f"{c['config']['slots_per_node']} `{RESOURCE}` each; {c['config']['workers']} worker actors; "
             f"{c['config']['streams']} live streams ({c['config']['size']} at {c['config']['fps']} fps, mesh "
             "swapper) pulled over RTMP from nginx-rtmp (ffmpeg publishers) and pushed back to it.", "",
             "`cluster_place_ms`: one `POST /api/streams` as a client sees it: placement by the workers' load "
             "reports, the request to the chosen actor on its node, and the stream's start there. "
             "`cluster_failover_s`: from the removal of a node to frames out of each of its streams from another "
             "node (the API's count on the new worker), the input pulled again and the output pushed to the same "
             "URL.", "",
             f"The machine's load average (1 min) at the node's removal: {c['load_average_1m']} on its "
             f"{os.cpu_count()} cores (the run shares the machine with whatever else runs there).", "",
             "| metric | stat | value |", "|---|---|---|"]
    lines += [f"| {r['metric']} | {r['stat']} | {r['value']} {r['unit']} |" for r in recs]
    lines += ["", f"Streams by node before: `{json.dumps(s['nodes_before'])}`  ",
              f"after removing the node that held {', '.join(s['moved'])}: `{json.dumps(s['nodes_after'])}`  ",
              f"watermark found in each output before: {all(s['watermark_before'].values())}, "
              f"in the moved streams' outputs after: {all(s['watermark_after'].values())}  ",
              f"models gate: a create while no node's models verified got {s['models_gate']['create_status']}; "
              f"the workers took streams {s['models_verified_s']} s after the models were installed."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--slots", type=int, default=3, help=f"the {RESOURCE} resource of each node")
    ap.add_argument("--workers", type=int, default=6,
                    help="worker actors; failover needs idle ones: each takes no second stream while its "
                         "device thread is busier than half the time")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--fps", type=int, default=10)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--name", default="cluster")
    args = ap.parse_args()
    try:
        args.size = tuple(int(x) for x in args.size.split("x"))
        assert len(args.size) == 2 and min(args.size) >= 64
    except (ValueError, AssertionError):
        sys.exit(f"error: --size takes WIDTHxHEIGHT, at least 64x64, e.g. 320x240 (got {args.size!r})")
    if args.nodes < 2 or args.workers < 2 or args.streams < 2 or args.slots * (args.nodes - 1) < args.workers:
        sys.exit("error: --nodes, --workers and --streams must be at least 2, and the nodes other than one "
                 "must have --slots enough for every worker (a removed node's worker is started again)")
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("error: Ray is not installed: pip install 'swapstream[cluster]'")
    if shutil.which("ffmpeg") is None:
        sys.exit("error: ffmpeg is not installed: install the Debian package ffmpeg")
    # Ray's usage statistics go to the internet; a benchmark (and CI, which has no internet) sends none.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        summary = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "python tools/bench_cluster.py " + " ".join(sys.argv[1:])
    recs = records(summary, args, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(recs, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(summary, recs))
    print(f"wrote {args.out / args.name}.json and .md", flush=True)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
