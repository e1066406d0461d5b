"""Load generator for `swapstream serve`: N live streams into the server users run, measured from
outside.

    python tools/bench_streams.py --clip 720p=.bench/streams_720p30.mp4 --clip 1080p=.bench/streams_1080p30.mp4 \\
        [--workers 8] [--ns 8,16,32] [--res 720p,1080p] [--source file|rtmp] [--sink null|rtmp] \\
        [--seconds 8] [--swapper mesh|inswapper_128] [--models-dir DIR] [--set key=value ...] \\
        [--check-output] [--out docs/benchmarks] [--name serve_streams]

It starts `swapstream serve --workers W` (the product: its worker processes, placement, batching,
drop policy and degradation are what is measured; this file holds none of its own), then for each N:
- creates N streams through the control API, each with the source face, at random moments of a
  frame period (random arrival phases, as unrelated sources have);
- feeds them at real-time pace: with `--source file` the server paces its file inputs itself (the
  API's `realtime` input); with `--source rtmp` one publisher process per stream pushes the clip to
  a real nginx-rtmp (PyAV, paced to the clip's timestamps) and the server pulls it;
- sends the output to a null sink or, with `--sink rtmp`, pushes it to nginx-rtmp;
- waits until every stream delivers at its clip's rate (swap backends and CUDA graphs built, first frames
  out; at most `--warmup-timeout`), then `--settle` seconds more, and reads each stream's counters
  twice, `--seconds` apart, and its latency (the server's own: a frame's arrival, decoded, to its
  encoded output; p50 and p99 over the frames output in the stream's last 10 seconds, so `--seconds`
  is at most 10, and with less the window reaches back into the settle time);
- with `--check-output` (RTMP sink), pulls two seconds of each output and looks for the watermark.

A configuration is within budget when every stream's p99 is at most `--budget-ms` and at most 1% of
the frames due in the window failed to come out (dropped anywhere, or never delivered in time).
Results: `<out>/<name>.json` (records as in docs/benchmarks) and `<out>/<name>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import source_image, wait_ready  # noqa: E402

MS = Fraction(1, 1000)  # FLV's time base: what the publishers' timestamps count
LATENCY_WINDOW_S = 10.0  # a stream's `latency_window_ms` in the API (runtime.stream.LATENCY_WINDOW_S)


# -- publishers ------------------------------------------------------------------------------------


def clip_fps(path: Path) -> float:
    """The clip's frame rate (its video stream's average rate)."""
    import av

    with av.open(str(path)) as c:
        rate = c.streams.video[0].average_rate
    if not rate:
        sys.exit(f"error: '{path}' declares no frame rate; make the clips with tools/make_bench_clips.py")
    return float(rate)


def publish(clip: str, url: str) -> None:
    """Push `clip` to `url` (FLV) for ever, paced to its timestamps, timestamps carrying on at each
    loop: a live encoder as far as the server can tell. Runs as its own process."""
    import av

    offset = 0.0
    period = 1.0 / clip_fps(Path(clip))
    t0 = time.monotonic()
    with av.open(url, "w", format="flv") as out:
        src = av.open(clip)
        vin = src.streams.video[0]
        vout = out.add_stream_from_template(vin)
        while True:
            last = 0.0
            for pkt in src.demux(vin):
                if pkt.pts is None:
                    continue
                t = float(pkt.pts * vin.time_base) + offset
                wait = t0 + t - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                last = t
                pkt.stream = vout
                # The packet's own time base says what its numbers count: left as the clip's (1/15360
                # for an MP4 at 15 fps), milliseconds were read as ticks of that, and the stream ran 15
                # times too slow in its timestamps while the packets came in real time.
                pkt.time_base = MS
                pkt.pts = pkt.dts = round(t * 1000)
                out.mux(pkt)
            offset = last + period
            src.close()
            src = av.open(clip)
            vin = src.streams.video[0]


# -- the server ------------------------------------------------------------------------------------


class Api:
    """The control API of the server under test."""

    def __init__(self, base: str, token: str) -> None:
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             ctype: str | None = None, timeout: float = 120.0) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = ctype or "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, payload = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, payload = e.code, e.read()
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload.decode(errors="replace")


def start_serve(args: argparse.Namespace, work: Path, port: int, token: str,
                rtmp_port: int | None) -> subprocess.Popen[bytes]:
    (work / "token").write_text(token)
    # The stream API alone (--no-webrtc): the streams measured are the API's; WHIP would only load
    # models beside them.
    cmd = [sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(args.workers), "--media-root", str(work / "media"),
           "--api-token-file", str(work / "token"), "--config", "multi_stream",
           "--set", f"swapper={args.swapper}", "--set", f"runtime.budget_ms={args.budget_ms}",
           *[x for s in args.set for x in ("--set", s)]]
    if rtmp_port is not None:
        # The local nginx listens on an ephemeral port: the outbound policy allows 1935 alone.
        cmd += ["--set", f"runtime.allowed_ports=[{rtmp_port}]"]
    if args.synthetic_models:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_pipeline import write_synthetic_models

        write_synthetic_models(work / "models", face_stack=args.face_stack)
        cmd += ["--set", f"models_dir={work / 'models'}", "--set", "neural.download=false"]
    elif args.models_dir:
        cmd += ["--set", f"models_dir={args.models_dir}"]
    print("serve:", " ".join(cmd[2:]), flush=True)
    return subprocess.Popen(cmd)


# -- one configuration -----------------------------------------------------------------------------


def run_config(api: Api, args: argparse.Namespace, n: int, res: str, rtmp_base: str | None,
               face: bytes, rng: random.Random) -> dict[str, Any]:
    clip = f"clip_{res}.mp4"
    fps = args.fps[res]
    pubs: list[subprocess.Popen[bytes]] = []
    ids = [f"b{res}-{n}-{i}" for i in range(n)]
    wait_idle(api)
    try:
        for i, sid in enumerate(ids):
            if args.source == "rtmp":
                assert rtmp_base is not None
                pubs.append(subprocess.Popen([sys.executable, __file__, "--publish", str(args.media / clip),
                                              f"{rtmp_base}/in-{sid}"]))
        time.sleep(1.0 if pubs else 0.0)  # publishers connected before the server pulls
        for i, sid in enumerate(ids):
            time.sleep(rng.random() / fps)  # a random arrival phase for each stream
            inp: Any = ({"url": f"{rtmp_base}/in-{sid}", "reconnect_seconds": 10.0} if args.source == "rtmp"
                        else {"file": clip, "loop": True, "realtime": True})
            outputs = ([{"type": "rtmp", "url": f"{rtmp_base}/out-{sid}"}] if args.sink == "rtmp"
                       else [{"type": "null"}])
            status, info = api.call("POST", "/api/streams", {"id": sid, "input": inp, "outputs": outputs,
                                                             "swapper": args.swapper, "preset": "multi_stream",
                                                             "budget_ms": args.budget_ms,
                                                             "set": stream_overrides(args.set)})
            if status == 503:
                # The server refused: no worker has room within the budget. That is the result.
                print(f"refused at stream {i + 1} of {n}: {info}", flush=True)
                return {"n": n, "res": res, "fps": round(fps, 2), "source": args.source, "sink": args.sink,
                        "refused_at": i + 1, "refusal": info.get("error") if isinstance(info, dict) else info,
                        "within_budget": False, "streams_failed": n - i, "frames_out": 0, "faces_per_s": 0.0,
                        "drops_pct": 100.0, "p99_ms_worst_stream": None, "p50_ms_median_stream": None,
                        "streams_degraded": 0, "warm": False, "seconds": 0.0}
            if status != 201:
                raise RuntimeError(f"creating stream {sid} failed: {status} {info}")
            status, info = api.call("PUT", f"/api/streams/{sid}/source", raw=face, ctype="image/png")
            if status != 200:
                raise RuntimeError(f"setting the face of {sid} failed: {status} {info}")
        warm = wait_steady(api, ids, fps, args.warmup_timeout)
        time.sleep(args.settle)
        before = {s["id"]: s for s in api.call("GET", "/api/streams")[1]["streams"]}
        stages0 = stage_sums(api, set(ids))
        t0 = time.monotonic()
        gpu_util, gpu_mem = sample_gpu(args.seconds)
        procs = gpu_processes_mib()
        after = {s["id"]: s for s in api.call("GET", "/api/streams")[1]["streams"]}
        span = time.monotonic() - t0
        stages = stage_means(stages0, stage_sums(api, set(ids)))
        marks = check_outputs(rtmp_base, ids) if args.check_output and args.sink == "rtmp" else None
        workers = api.call("GET", "/api/workers")[1]
    finally:
        for sid in ids:
            try:
                api.call("DELETE", f"/api/streams/{sid}")
            except OSError:  # the server is gone (an interrupted run): what raised first matters
                break
        for p in pubs:
            p.kill()
            p.wait()
    due = fps * span
    per = []
    for sid in ids:
        a, b = before.get(sid), after.get(sid)
        if a is None or b is None or b.get("state") != "running":
            per.append({"id": sid, "state": (b or {}).get("state"), "error": (b or {}).get("error")})
            continue
        out = b["frames_out"] - a["frames_out"]
        window = b["latency_window_ms"]
        per.append({"id": sid, "worker": b.get("worker"), "frames_out": out,
                    "faces": b["faces_swapped"] - a["faces_swapped"],
                    "missing_pct": round(max(0.0, due - out) * 100 / due, 2),
                    "p50_ms": window["p50"], "p99_ms": window["p99"], "level": b["level"]})
        print("  stream", json.dumps(per[-1]), flush=True)
    ok = [s for s in per if "p99_ms" in s]
    missing = sum(max(0.0, due - s["frames_out"]) for s in ok) + due * (n - len(ok))
    p99s = [s["p99_ms"] for s in ok if s["p99_ms"] is not None]
    p50s = sorted(s["p50_ms"] for s in ok if s["p50_ms"] is not None)
    row = {"n": n, "res": res, "fps": round(fps, 2), "warm": warm, "source": args.source, "sink": args.sink, "seconds": round(span, 2),
           "frames_out": sum(s["frames_out"] for s in ok),
           "faces_per_s": round(sum(s["faces"] for s in ok) / span, 1),
           "drops_pct": round(missing * 100 / (due * n), 2),
           "p99_ms_worst_stream": max(p99s) if p99s else None,
           "p50_ms_median_stream": p50s[len(p50s) // 2] if p50s else None,
           "streams_failed": n - len(ok), "streams_degraded": sum(1 for s in ok if s["level"] > 0),
           "stage_ms_mean": stages, "gpu_util_mean": gpu_util, "gpu_memory_mib_peak": gpu_mem,
           "gpu_memory_mib_idle": args.idle_mib, "gpu_processes_mib": procs,
           "per_stream": per, "workers": workers.get("workers") if isinstance(workers, dict) else None}
    row["within_budget"] = bool(ok) and len(ok) == n and max(p99s, default=1e9) <= args.budget_ms \
        and row["drops_pct"] <= 1.0
    if marks is not None:
        row["watermark_found"] = marks
    print(json.dumps({k: v for k, v in row.items() if k not in ("per_stream", "workers")}), flush=True)
    for w in row["workers"] or []:
        print("  worker", json.dumps({"name": w.get("name"), "streams": len(w.get("streams") or []),
                                      "busy": (w.get("load") or {}).get("busy"), "refusal": w.get("refusal"),
                                      "mps_client": w.get("mps_client")}),
              flush=True)
    return row


def sample_gpu(seconds: float) -> tuple[float | None, int | None]:
    """Sleep `seconds` while sampling the GPUs' utilisation and memory (NVML, every 0.25 s): the
    mean utilisation over them and the window, 0..1, and the most device memory in use, in MiB
    (None, None without NVML)."""
    from swapstream.runtime.metrics import GpuMonitor

    gpu = GpuMonitor()
    vals: list[float] = []
    peak: int | None = None
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        samples = gpu.sample()
        vals += [g.utilization for g in samples]
        if samples:
            peak = max(peak or 0, sum(g.memory_used for g in samples) >> 20)
        time.sleep(min(0.25, left))
    gpu.close()
    return (round(sum(vals) / len(vals), 3) if vals else None), peak


def gpu_memory_mib() -> int | None:
    """Device memory in use now, summed over the GPUs, in MiB (None without NVML)."""
    from swapstream.runtime.metrics import GpuMonitor

    gpu = GpuMonitor()
    samples = gpu.sample()
    gpu.close()
    return sum(g.memory_used for g in samples) >> 20 if samples else None


def gpu_processes_mib() -> dict[str, int]:
    """Device memory per process as NVML lists them ("pid name" -> MiB); under MPS the driver may
    list the MPS server alone, or its clients without a figure (then left out)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    out: dict[str, int] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.usedGpuMemory:  # None or 0 where the driver does not say
                    try:
                        name = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")[0].decode()[-40:]
                    except OSError:
                        name = "?"
                    out[f"{p.pid} {name}"] = p.usedGpuMemory >> 20
    except Exception as e:  # NVML errors: record nothing rather than fail the run
        print(f"warning: NVML could not list the GPU's processes: {e}", flush=True)
    finally:
        pynvml.nvmlShutdown()
    return out


def wait_idle(api: Api, timeout: float = 30.0) -> None:
    """Until every worker reports no stream and an idle device thread: each configuration starts
    from a quiet server, not from the last one's load reports (their busy share spans 5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, info = api.call("GET", "/api/workers")
        if status == 404:
            return  # one process, no workers: its streams went with the last DELETE
        loads = [w.get("load") or {} for w in info.get("workers", [])] if status == 200 and isinstance(info, dict) else []
        if loads and all(not x.get("streams") and float(x.get("busy") or 0.0) < 0.05 for x in loads):
            return
        time.sleep(0.5)
    print(f"warning: the workers were not idle {timeout:.0f} s after the last configuration", flush=True)


def wait_steady(api: Api, ids: list[str], fps: float, timeout: float) -> bool:
    """Until every stream has put out frames at 90% of its rate for 2 s (what the API's `fps` is
    over); False if `timeout` passed first (the run goes on, and says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        streams = {s["id"]: s for s in api.call("GET", "/api/streams")[1]["streams"]}
        if all(streams.get(sid, {}).get("fps", 0.0) >= 0.9 * fps for sid in ids):
            return True
        time.sleep(0.5)
    print(f"warning: not every stream reached 90% of {fps:g} fps in {timeout:.0f} s", flush=True)
    return False


BATCH_KEYS = {"swapstream_batch_size": "batch_faces", "swapstream_batch_seconds": "batch_run",
              "swapstream_analysis_batch_size": "analysis_frames",
              "swapstream_analysis_batch_seconds": "analysis_run"}
"""The server's batch histograms, by the name their means take in a record."""
COUNT_KEYS = ("batch_faces", "analysis_frames")
"""Of those, the ones that count (faces, frames) rather than time."""


def stage_sums(api: Api, ids: set[str]) -> dict[str, tuple[float, float]]:
    """The server's own per-stage time histograms (/metrics), summed over the streams in `ids`:
    stage -> (seconds, frames); and the swap and analysis batches' faces (frames) and seconds per
    call (BATCH_KEYS)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = api.call("GET", "/metrics")
    out: dict[str, list[float]] = {}
    if status != 200 or not isinstance(text, str):
        return {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if fam.name == "swapstream_stage_latency_seconds" and smp.labels.get("stream") in ids:
                key = smp.labels["stage"]
            elif fam.name in BATCH_KEYS:
                key = BATCH_KEYS[fam.name]
            else:
                continue
            if smp.name.endswith("_sum"):
                out.setdefault(key, [0.0, 0.0])[0] += smp.value
            elif smp.name.endswith("_count"):
                out.setdefault(key, [0.0, 0.0])[1] += smp.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def stage_means(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each stage's mean over the window between two `stage_sums` (ms; COUNT_KEYS in faces or frames)."""
    out = {}
    for k, (s1, n1) in b.items():
        s0, n0 = a.get(k, (0.0, 0.0))
        if n1 > n0:
            out[k] = round((s1 - s0) / (n1 - n0) * (1.0 if k in COUNT_KEYS else 1e3), 2)
    return out


def stream_overrides(items: list[str]) -> list[str]:
    """The --set items a stream takes too (its analysis and swap settings); the server's own
    (runtime, models_dir...) go to serve alone, and the API would refuse them per stream."""
    from swapstream.runtime.manager import SERVER_SETTINGS

    return [x for x in items if x.split("=", 1)[0].strip().split(".")[0] not in SERVER_SETTINGS]


def check_outputs(rtmp_base: str | None, ids: list[str]) -> dict[str, bool]:
    """Two seconds of each RTMP output, pulled back and checked for the invisible watermark."""
    from swapstream.verify import verify

    assert rtmp_base is not None
    found: dict[str, bool] = {}
    for sid in ids:
        t0 = time.monotonic()
        found[sid] = verify(f"{rtmp_base}/out-{sid}", max_frames=60).found
        print(f"out-{sid}: watermark {'found' if found[sid] else 'NOT found'} ({time.monotonic() - t0:.1f} s)",
              flush=True)
    return found


# -- results ---------------------------------------------------------------------------------------


def records(rows: list[dict[str, Any]], args: argparse.Namespace, command: str) -> list[dict[str, Any]]:
    from swapstream.runtime.metrics import GpuMonitor

    gpu = GpuMonitor()
    samples = gpu.sample()
    device = samples[0].name if samples else f"CPU ({os.cpu_count()} cores)"
    gpu.close()
    # GIT_SHA: the GPU machine's copy of the tree may carry a stale .git (tools/device_check.sh).
    commit = os.environ.get("GIT_SHA") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                         capture_output=True, text=True).stdout.strip()
    common = {"device": device, "commit": commit or "unknown", "date": datetime.date.today().isoformat(),
              "command": command}
    out = []
    for r in rows:
        cfg = {"n": r["n"], "res": r["res"], "fps": r["fps"], "source": r["source"], "sink": r["sink"],
               "workers": args.workers, "swapper": args.swapper, "budget_ms": args.budget_ms,
               "set": args.set, "within_budget": r["within_budget"], "stage_ms_mean": r.get("stage_ms_mean")}
        tag = f"{r['res']}{round(r['fps'])}_{r['sink']}_n{r['n']}"
        for metric, value, unit, stat in ((f"serve_latency_{tag}", r["p99_ms_worst_stream"], "ms", "p99"),
                                          (f"serve_latency_{tag}", r["p50_ms_median_stream"], "ms", "p50"),
                                          (f"serve_drops_{tag}", r["drops_pct"], "%", "mean"),
                                          (f"serve_faces_per_s_{tag}", r["faces_per_s"], "faces/s", "mean")):
            out.append({"metric": metric, "value": value, "unit": unit, "stat": stat, "config": cfg, **common})
        if r.get("gpu_memory_mib_peak") is not None and r.get("gpu_memory_mib_idle") is not None:
            # What the server added to the device (its workers, their CUDA contexts, the MPS server),
            # at its most in the window, shared out over the workers.
            per = (r["gpu_memory_mib_peak"] - r["gpu_memory_mib_idle"]) / args.workers
            out.append({"metric": f"serve_gpu_memory_per_worker_{tag}", "value": round(per), "unit": "MiB",
                        "stat": "max", "config": {**cfg, "device_mib_peak": r["gpu_memory_mib_peak"],
                                                  "device_mib_before_serve": r["gpu_memory_mib_idle"],
                                                  "processes_mib": r.get("gpu_processes_mib")}, **common})
    if args.start_s is not None:
        out.append({"metric": "serve_start_s", "value": args.start_s, "unit": "s", "stat": "once",
                    "config": {"workers": args.workers, "swapper": args.swapper, "set": args.set}, **common})
    for res in sorted({r["res"] for r in rows}):
        for sink in sorted({r["sink"] for r in rows}):
            ok = [r["n"] for r in rows if r["res"] == res and r["sink"] == sink and r["within_budget"]]
            fps = round(next(r["fps"] for r in rows if r["res"] == res))
            out.append({"metric": f"serve_streams_{res}{fps}_{sink}_within_budget", "value": max(ok, default=0),
                        "unit": "streams", "stat": "max", "config": {"workers": args.workers, "swapper": args.swapper,
                                                                      "budget_ms": args.budget_ms}, **common})
            fast = [r["faces_per_s"] for r in rows if r["res"] == res and r["sink"] == sink and r["drops_pct"] <= 1.0]
            out.append({"metric": f"serve_faces_per_s_{res}_{sink}", "value": max(fast, default=0.0),
                        "unit": "faces/s", "stat": "max", "config": {"drops_pct_at_most": 1.0,
                                                                      "workers": args.workers}, **common})
    return out


def markdown(rows: list[dict[str, Any]], recs: list[dict[str, Any]], workers: int) -> str:
    c = recs[0]
    lines = [f"# swapstream serve under load ({c['device']}, {c['commit']}, {c['date']})", "",
             f"Command: `{c['command']}`", "",
             "Latency is the server's own, from a frame's arrival (decoded) to its encoded output: the worst "
             "stream's p99 and the median stream's p50. Drops are the frames due in the window that did "
             "not come out.", "",
             "| res | sink | source | N | p50 ms | worst p99 ms | drops % | faces/s | degraded | failed | within budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['res']} | {r['sink']} | {r['source']} | {r['n']} | {r['p50_ms_median_stream']} | "
                     f"{r['p99_ms_worst_stream']} | {r['drops_pct']} | {r['faces_per_s']} | "
                     f"{r['streams_degraded']} | {r['streams_failed']} | {'yes' if r['within_budget'] else 'no'} |")
    staged = [r for r in rows if r.get("stage_ms_mean")]
    if staged:
        keys = ("queue", "analyse", "swap_wait", "swap", "encode", "total", "analysis_run", "analysis_frames",
                "batch_run", "batch_faces")
        lines += ["", "GPU utilisation (NVML, mean over the window): " + ", ".join(
            f"{r['res']} N={r['n']}: {r['gpu_util_mean']:.0%}" for r in staged if r.get("gpu_util_mean") is not None)]
        lines += ["", "Where a frame's time goes (the server's own stage histograms, means over the window; "
                  "analyse includes its batch's wait; analysis_run is one analysis call, analysis_frames its "
                  "frames; batch_run is one swap call, batch_faces its faces):", "",
                  "| res | N | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
        for r in staged:
            m = r["stage_ms_mean"]
            lines.append(f"| {r['res']} | {r['n']} | " + " | ".join(str(m.get(k, "-")) for k in keys) + " |")
    mem = [r for r in rows if r.get("gpu_memory_mib_peak") is not None and r.get("gpu_memory_mib_idle") is not None]
    if mem:
        lines += ["", "GPU memory (NVML, the most in use in the window, less what was in use before serve "
                  "started, over the workers): " + ", ".join(
                      f"{r['res']} N={r['n']}: {(r['gpu_memory_mib_peak'] - r['gpu_memory_mib_idle']) / workers:.0f} "
                      f"MiB per worker" for r in mem)]
    lines += ["", "| summary | value |", "|---|---|"]
    lines += [f"| {x['metric']} | {x['value']} {x['unit']} |" for x in recs if x["stat"] in ("max", "once")]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--publish":
        publish(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clip", action="append", default=[], metavar="LABEL=PATH",
                    help="a clip the streams play, named by a label such as 720p (repeat)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--ns", default="2")
    ap.add_argument("--res", help="the clip labels to run, comma-separated (default: every --clip)")
    ap.add_argument("--source", choices=("file", "rtmp"), default="file")
    ap.add_argument("--sink", choices=("null", "rtmp"), default="null")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--warmup-timeout", type=float, default=120.0)
    ap.add_argument("--budget-ms", type=float, default=33.0)
    ap.add_argument("--swapper", default="mesh")
    ap.add_argument("--models-dir", type=Path)
    ap.add_argument("--synthetic-models", action="store_true",
                    help="the full-size inswapper architecture with random weights (what the GPU benchmarks run)")
    ap.add_argument("--face-stack", action="store_true",
                    help="with --synthetic-models: add the XSeg occluder and the GFPGAN v1.4 enhancer "
                         "(real architectures, random weights) and run them: mask.types=box,occlusion, "
                         "enhancer=gfpgan_1.4, with the degradation ladder off (runtime.degrade=false)")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--check-output", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--name", default="serve_streams")
    args = ap.parse_args()
    clips: dict[str, Path] = {}
    for item in args.clip:
        label, sep, path = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_]{1,16}", label):
            sys.exit(f"error: --clip takes LABEL=PATH with a label of letters and digits, got {item!r}")
        if not Path(path).is_file():
            sys.exit(f"error: no clip at '{path}': make them with python tools/make_bench_clips.py")
        clips[label] = Path(path)
    if not clips:
        sys.exit("error: give at least one --clip LABEL=PATH")
    try:
        ns = [int(x) for x in args.ns.split(",")]
    except ValueError:
        sys.exit(f"error: --ns takes whole numbers joined by commas, got {args.ns!r}")
    resolutions = args.res.split(",") if args.res else list(clips)
    if any(n < 1 for n in ns) or not set(resolutions) <= set(clips):
        sys.exit(f"error: --ns must be at least 1 and --res among the clip labels {sorted(clips)} "
                 f"(got {args.ns!r}, {args.res!r})")
    args.fps = {label: clip_fps(clips[label]) for label in resolutions}
    if args.face_stack:
        if not args.synthetic_models:
            sys.exit("error: --face-stack adds to --synthetic-models; give both")
        # Stream settings as well as the server's: they reach every stream through the API.
        # The ladder off: its first step drops the enhancer, and the capacity measured is that of
        # the whole stack, not of the swap that a late stream falls back to.
        args.set += ["mask.types=box,occlusion", "enhancer=gfpgan_1.4", "runtime.degrade=false"]
    if not 0 < args.seconds <= LATENCY_WINDOW_S:
        sys.exit(f"error: --seconds must be above 0 and at most {LATENCY_WINDOW_S:g}: a stream's latency in "
                 f"the API covers its last {LATENCY_WINDOW_S:g} s")
    from swapstream.live.nginx import NginxRtmp, free_port

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    args.media = work / "media"
    args.media.mkdir()
    for label in resolutions:
        shutil.copy(clips[label], args.media / f"clip_{label}.mp4")
    nginx = NginxRtmp(work / "nginx").start() if "rtmp" in (args.source, args.sink) else None
    rtmp_base = f"rtmp://127.0.0.1:{nginx.port}/live" if nginx else None
    port = free_port()
    import secrets

    api = Api(f"http://127.0.0.1:{port}", secrets.token_urlsafe(24))
    args.idle_mib = gpu_memory_mib()  # before the server: what it adds is its own
    proc = start_serve(args, work, port, api.token, nginx.port if nginx else None)
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    command = "python tools/bench_streams.py " + " ".join(sys.argv[1:])

    def save() -> None:
        # After every configuration: a run cut short (a time limit) keeps the ones it finished.
        recs = records(rows, args, command)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(recs, indent=1) + "\n")
        (args.out / f"{args.name}.md").write_text(markdown(rows, recs, args.workers))

    args.start_s = None  # until serve is ready
    try:
        try:
            args.start_s = round(wait_ready(api.base, proc, 600), 1)
        except RuntimeError as e:
            sys.exit(f"error: {e}")
        print(f"serve ready after {args.start_s:.1f} s", flush=True)
        face = source_image(work).read_bytes()
        for res in resolutions:
            for n in ns:
                rows.append(run_config(api, args, n, res, rtmp_base, face, rng))
                save()
    except KeyboardInterrupt:  # a time limit (timeout -s INT) or Ctrl+C: keep what finished
        print(f"interrupted: {len(rows)} configuration(s) finished and kept", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if nginx is not None:
            nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
    save()
    print(f"wrote {args.out / args.name}.json and .md")


if __name__ == "__main__":
    main()
