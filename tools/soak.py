"""Soak: `swapstream live` and `swapstream serve` (2 API streams) against nginx-rtmp for a given time,
with a fault every few minutes, measuring recovery, A/V skew, latency and resources.

    python tools/soak.py --minutes 60 --out docs/benchmarks/soak.json
    python tools/soak.py --minutes 3 --fault-every 30 --out /tmp/soak.json   # the CI version

Peers, all on loopback: one nginx-rtmp; three publisher processes (`tests.helpers.avsync`: FLV
through libavformat, as ffmpeg publishes, with frame-numbered video and a tone that names its second);
`swapstream live` (publisher 1 in, RTMP out) and `swapstream serve` with two API streams (publishers 2
and 3 in, RTMP out); a receiver on each of the three outputs. A publisher that exits (its server went
away) is started again after 0.5 s, as OBS does.

Faults, in turn, every `--fault-every` seconds after a warm-up:
- `nginx_restart`: nginx stopped for 2 s and started again on the same port (every input, output and
  viewer drops at once);
- `publisher_kill`: every publisher killed (SIGKILL) and started again 2 s later, its clock at 0;
- `stall`: nginx paused (SIGSTOP) for 3 s, then resumed: a network that stops moving;
- `timestamp_jump`: every publisher started again, with its timestamps jumping by 100 s 3 s in.
Each fault's cause ends when the publishers are publishing again (after nginx's restart: they
reconnect, as OBS does), nginx resumes, or the jump is sent. Its recovery time, per output, is from then until the first frame that arrives with a latency
within 0.5 s of that output's median before the fault. The A/V skew is measured on the output's own
timestamps at every tone onset (`tests.helpers.avsync.skews`); "after a fault" is from its recovery
to the next fault. RSS, open files and threads of the two swapstream processes are sampled every 10 s, and
the median of the last minute is set against the minute from minute 5 (or from the end of the
warm-up, for a short run): RSS may grow 5 %, fds and threads not beyond that first minute's highest.

The JSON has every fault with its recovery per output, the skews, the resource samples and a verdict
against the issue's bar: every fault recovered within 5 s, RSS growth from minute 5 (or the first
sample after the warm-up, for a short run) to the end ≤ 5 %, no fd or thread growth, skew ≤ 40 ms
after every fault, no crash. Exit code 0 when it passes, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_streams import Api  # noqa: E402
from benchlib import wait_ready  # noqa: E402

from swapstream.live.nginx import NginxRtmp, free_port  # noqa: E402
from tests.helpers import avsync  # noqa: E402

FPS = 10
OUTPUTS = ("live", "s1", "s2")
FAULTS = ("nginx_restart", "publisher_kill", "stall", "timestamp_jump")
RECOVERY_S = 5.0
SKEW_MS = 40.0
RSS_GROWTH_PCT = 5.0


class Publishers:
    """One publisher process per input, each started again 0.5 s after it exits unless held down."""

    def __init__(self, urls: dict[str, str], t0: float, log: Path) -> None:
        self.urls, self.t0, self.log = urls, t0, log
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.publishing: dict[str, float] = {}
        """When each publisher last said it was connected."""
        self.extra: list[str] = []
        self.held = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="publishers", daemon=True)

    def start(self) -> "Publishers":
        self._thread.start()
        return self

    def _spawn(self, name: str) -> None:
        with self.log.open("ab") as err:
            p = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.avsync", "publish", self.urls[name], "--t0",
                 str(self.t0), "--fps", str(FPS), *self.extra], cwd=ROOT, stdout=subprocess.PIPE,
                stderr=err, text=True)
        self.procs[name] = p
        threading.Thread(target=self._watch, args=(name, p), daemon=True).start()

    def _watch(self, name: str, p: subprocess.Popen[str]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("publishing"):
                self.publishing[name] = time.time()

    def wait_publishing(self, since: float, timeout: float = 30.0, nudge_after: float = 6.0) -> float:
        """When every publisher was publishing again after `since` (the end of a fault's cause: a
        streamer's encoder is back); `time.time()` if that took longer than `timeout`.

        A publisher that has not published again `nudge_after` seconds after `since` is stuck on
        its dead connection (its write neither failed nor went through): it is killed once and so
        started again, as OBS drops a connection that stopped moving and reconnects. Without that
        the whole fault window passed now and then with a publisher hung, and the product's
        recovery was never measured."""
        deadline = time.time() + timeout
        nudged = False
        while time.time() < deadline:
            times = [self.publishing.get(n, 0.0) for n in self.urls]
            if min(times) > since:
                return max(times)
            if not nudged and time.time() > since + nudge_after:
                nudged = True
                with self._lock:
                    for n in self.urls:
                        p = self.procs.get(n)
                        if self.publishing.get(n, 0.0) <= since and p is not None and p.poll() is None:
                            p.kill()
            time.sleep(0.05)
        return time.time()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                for name in self.urls:
                    p = self.procs.get(name)
                    if not self.held.is_set() and (p is None or p.poll() is not None):
                        self._spawn(name)
            self._stop.wait(0.5)

    def kill(self, *, hold: bool) -> None:
        with self._lock:
            if hold:
                self.held.set()
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait()
            self.procs.clear()

    def release(self, extra: list[str] | None = None) -> None:
        """Let the publishers start again (with `extra` arguments, once: a jump happens once)."""
        with self._lock:
            self.extra = extra or []
            for name in self.urls:
                self._spawn(name)
            self.extra = []
            self.held.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.kill(hold=True)


def tree_stats(pid: int) -> dict[str, float] | None:
    """RSS (MB), open fds and threads of a process and its children, from /proc; None once it is gone."""
    pids = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(k) for k in kids]
    except OSError:
        return None
    rss = fds = threads = 0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
            fields = {line.split(":")[0]: line.split(":")[1].split() for line in status if ":" in line}
            rss += int(fields["VmRSS"][0])
            threads += int(fields["Threads"][0])
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except (OSError, KeyError, IndexError):
            if p == pid:
                return None
    return {"rss_mb": round(rss / 1024, 1), "fds": fds, "threads": threads}


class Measure:
    """Keeps, per output, the frames' (arrival, latency) and the onsets' (arrival, skew) seen so far.
    The receivers keep only their last seconds; this takes what is new every few seconds."""

    def __init__(self, receivers: dict[str, avsync.Receiver], t0: float) -> None:
        self.receivers, self.t0 = receivers, t0
        self.latency: dict[str, dict[tuple[int, float], tuple[float, float]]] = {k: {} for k in receivers}
        self.skew: dict[str, dict[tuple[int, float], tuple[float, float]]] = {k: {} for k in receivers}

    def update(self) -> None:
        for name, r in self.receivers.items():
            for i, s in r.snapshot_indexed():
                for (n16, pts, arrived) in s.video:
                    n = avsync.unwrap16(n16, (arrived - self.t0) * FPS)
                    self.latency[name][(i, pts)] = (arrived, arrived - (self.t0 + n / FPS))
                if not s.video:
                    continue
                pts_arr = np.array([t for _, t, _ in s.video])
                for at, _src, sk in avsync.skews(s, FPS, self.t0):
                    j = int(np.argmin(np.abs(pts_arr - at)))
                    self.skew[name][(i, round(at, 3))] = (s.video[j][2], sk)

    def lat(self, name: str) -> list[tuple[float, float]]:
        return sorted(self.latency[name].values())

    def skews(self, name: str) -> list[tuple[float, float]]:
        return sorted(self.skew[name].values())


def start_serve(work: Path, face: Path, port: int, rtmp_port: int, token: str, log: Path) -> subprocess.Popen[bytes]:
    (work / "token").write_text(token)
    cmd = [sys.executable, "-m", "swapstream.cli", "serve", "--no-webrtc", "--host", "127.0.0.1", "--port",
           str(port), "--api-token-file", str(work / "token"), "-s", str(face),
           "--set", f"runtime.allowed_ports=[{rtmp_port}]"]
    return subprocess.Popen(cmd, cwd=work, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def start_live(work: Path, face: Path, inp: str, out: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "swapstream.cli", "live", "-s", str(face), "-i", inp, "--rtmp-out", out,
           "--reconnect", "60"]
    return subprocess.Popen(cmd, cwd=work, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def fault(kind: str, nginx: NginxRtmp, pubs: Publishers) -> float:
    """Cause the fault; returns when its cause ended (time.time())."""
    if kind == "nginx_restart":
        nginx.stop()
        time.sleep(2.0)
        back = time.time()
        nginx.start()
        return pubs.wait_publishing(back)  # the publishers found it again (OBS reconnects)
    if kind == "publisher_kill":
        pubs.kill(hold=True)
        time.sleep(2.0)
        back = time.time()
        pubs.release()
        return pubs.wait_publishing(back)
    if kind == "stall":
        assert nginx._proc is not None
        os.kill(nginx._proc.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(nginx._proc.pid, signal.SIGCONT)
        return time.time()
    if kind == "timestamp_jump":
        pubs.kill(hold=True)
        back = time.time()
        pubs.release(["--jump-at", "3", "--jump-by", "100"])
        return pubs.wait_publishing(back) + 3.0
    raise ValueError(kind)


def analyse(measure: Measure, faults: list[dict[str, Any]], end: float, t_start: float) -> None:
    """Fill each fault's recovery and skew per output (in place)."""
    for k, f in enumerate(faults):
        nxt = faults[k + 1]["started"] if k + 1 < len(faults) else end
        f["recovery_s"], f["max_abs_skew_ms_after"], f["onsets_after"] = {}, {}, {}
        for name in OUTPUTS:
            lat = measure.lat(name)
            before = [x for t, x in lat if f["started"] - 20 <= t < f["started"]]
            base = float(np.median(before)) if before else None
            rec = None
            if base is not None:
                after = [t for t, x in lat if f["cause_end"] <= t < nxt and x <= base + 0.5]
                rec = round(after[0] - f["cause_end"], 2) if after else None
            f["recovery_s"][name] = rec
            f.setdefault("latency_before_ms", {})[name] = round(base * 1e3, 1) if base is not None else None
            since = f["cause_end"] + (rec if rec is not None else RECOVERY_S)
            sk = [abs(x) * 1e3 for t, x in measure.skews(name) if since <= t < nxt]
            f["max_abs_skew_ms_after"][name] = round(max(sk), 1) if sk else None
            f["onsets_after"][name] = len(sk)
        f["started_s"] = round(f.pop("started") - t_start, 1)
        f["cause_end_s"] = round(f.pop("cause_end") - t_start, 1)


def resource_verdict(samples: list[dict[str, Any]], name: str, from_s: float) -> dict[str, Any]:
    # A minute of samples at each end: thread and fd counts move with the state of the moment (a
    # reconnect's thread, a connection being opened); a leak moves the whole window.
    rows = [s for s in samples if s.get(name)]
    first = [s[name] for s in rows if from_s <= s["t_s"] < from_s + 60]
    last = [s[name] for s in rows if s["t_s"] >= rows[-1]["t_s"] - 60] if rows else []
    if not first or not last:
        return {"ok": False, "why": "no samples"}
    r0 = float(np.median([x["rss_mb"] for x in first]))
    r1 = float(np.median([x["rss_mb"] for x in last]))
    out = {"from_s": from_s, "rss_mb_from": r0, "rss_mb_end": r1, "rss_growth_pct": round((r1 - r0) * 100 / r0, 2),
           "fds_from": int(np.median([x["fds"] for x in first])), "fds_end": int(np.median([x["fds"] for x in last])),
           "threads_from": int(np.median([x["threads"] for x in first])),
           "threads_end": int(np.median([x["threads"] for x in last]))}
    out["ok"] = (out["rss_growth_pct"] <= RSS_GROWTH_PCT
                 and out["fds_end"] <= max(x["fds"] for x in first)
                 and out["threads_end"] <= max(x["threads"] for x in first))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--fault-every", type=float, default=120.0, help="seconds between faults")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before the first fault "
                    "(default: the fault interval)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record (a .md table beside it)")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--replot", action="store_true", help="only write the .md and .png of an existing --out")
    args = ap.parse_args(argv)
    if args.replot:
        record = json.loads(args.out.read_text())
        record["plot"] = args.out.with_suffix(".png").name
        args.out.with_suffix(".md").write_text(markdown(record))
        plot(record, args.out.with_suffix(".png"))
        return 0
    import tempfile

    import cv2

    from swapstream.demo import astronaut

    work = args.work or Path(tempfile.mkdtemp(prefix="swapstream-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    face = work / "face.png"
    cv2.imwrite(str(face), cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    rtmp_port, api_port = free_port(), free_port()
    nginx = NginxRtmp(work / "nginx", rtmp_port=rtmp_port).start()
    url = nginx.url
    t0 = time.time() + 1.0
    pubs = Publishers({"live": url("live-in"), "s1": url("s1-in"), "s2": url("s2-in")}, t0,
                      work / "publishers.log").start()
    token = secrets.token_urlsafe(16)
    live = start_live(work, face, url("live-in"), url("live-out"), work / "live.log")
    serve = start_serve(work, face, api_port, rtmp_port, token, work / "serve.log")
    api = Api(f"http://127.0.0.1:{api_port}", token)
    try:
        wait_ready(api.base, serve, 120)
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    for sid in ("s1", "s2"):
        status, info = api.call("POST", "/api/streams", {
            "id": sid, "input": {"url": url(f"{sid}-in"), "reconnect_seconds": 60.0},
            "outputs": [{"type": "rtmp", "url": url(f"{sid}-out")}]})
        if status != 201:
            print(f"error: creating API stream {sid}: {status} {info}", file=sys.stderr)
            return 2
    receivers = {name: avsync.Receiver(url(f"{name}-out"), keep_seconds=40.0).start() for name in OUTPUTS}
    measure = Measure(receivers, t0)
    # The clock starts once every output is flowing: a fault before that would have no level before it.
    deadline = time.time() + 120
    while time.time() < deadline:
        measure.update()
        if all(len(measure.latency[name]) >= 3 * FPS for name in OUTPUTS):
            break
        time.sleep(1.0)
    else:
        counts = {name: len(measure.latency[name]) for name in OUTPUTS}
        print(f"error: not every output was flowing after 120 s (frames seen: {counts}; receivers: "
              f"{ {n: r.errors[-3:] for n, r in receivers.items()} })", file=sys.stderr)
    t_start = time.time()
    end = t_start + args.minutes * 60
    warmup = args.warmup if args.warmup is not None else args.fault_every
    samples: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    next_fault, next_sample, k = t_start + warmup, t_start, 0
    crashed: list[str] = []
    print(f"soak: {args.minutes:g} min, a fault every {args.fault_every:g} s; work folder {work}", flush=True)
    try:
        while time.time() < end:
            now = time.time()
            if now >= next_sample:
                samples.append({"t_s": round(now - t_start, 1), "live": tree_stats(live.pid),
                                "serve": tree_stats(serve.pid)})
                measure.update()
                next_sample = now + 10.0
            if now >= next_fault and now + 20 < end:
                kind = FAULTS[k % len(FAULTS)]
                k += 1
                started = time.time()
                cause_end = fault(kind, nginx, pubs)
                faults.append({"kind": kind, "started": started, "cause_end": cause_end})
                print(f"  {started - t_start:7.1f} s  {kind}", flush=True)
                next_fault = started + args.fault_every
            for name, p in (("live", live), ("serve", serve)):
                if p.poll() is not None and name not in crashed:
                    crashed.append(name)
                    print(f"  {name} exited with code {p.returncode}", flush=True)
            time.sleep(0.5)
        measure.update()
        streams = api.call("GET", "/api/streams")[1] if serve.poll() is None else {}
    finally:
        for r in receivers.values():
            r.stop()
        for p in (live, serve):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in (live, serve):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        pubs.stop()
        nginx.stop()
    analyse(measure, faults, end, t_start)
    from_s = 300.0 if args.minutes >= 10 else warmup
    resources = {name: resource_verdict(samples, name, from_s) for name in ("live", "serve")}
    states = {s["id"]: s.get("state") for s in streams.get("streams", [])} if isinstance(streams, dict) else {}
    recoveries = [r for f in faults for r in f["recovery_s"].values()]
    skews = [s for f in faults for s in f["max_abs_skew_ms_after"].values()]
    checks = {
        "every_fault_recovered_within_5_s": bool(faults) and all(r is not None and r <= RECOVERY_S for r in recoveries),
        "skew_within_40_ms_after_every_fault": bool(faults) and all(s is not None and s <= SKEW_MS for s in skews),
        "resources_bounded": all(r["ok"] for r in resources.values()),
        "no_crash": not crashed and all(states.get(s) == "running" for s in ("s1", "s2")),
    }
    lat_all = [x for name in OUTPUTS for _, x in measure.lat(name)]
    record = {
        "command": "python tools/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_sha": os.environ.get("GIT_SHA") or _git_sha(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (CPU path)",
        "minutes": args.minutes, "fault_every_s": args.fault_every, "fps": FPS, "size": "320x240",
        "faults": faults, "resources": resources, "crashed": crashed, "api_stream_states": states,
        "latency_ms_p50_all": round(float(np.median(lat_all)) * 1e3, 1) if lat_all else None,
        "worst_recovery_s": max((r for r in recoveries if r is not None), default=None),
        "worst_skew_ms": max((s for s in skews if s is not None), default=None),
        # Plays a receiver started again for bringing no video (tests.helpers.avsync.NO_VIDEO_S):
        # a viewer's hiccup, which only lengthens the recovery measured.
        "receiver_reopens": {name: r.reopens for name, r in receivers.items()},
        "checks": checks, "pass": all(checks.values()),
        "samples": samples,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record["plot"] = args.out.with_suffix(".png").name
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(record))
    plot(record, args.out.with_suffix(".png"))
    print(json.dumps({k: record[k] for k in ("worst_recovery_s", "worst_skew_ms", "checks", "pass")}), flush=True)
    return 0 if record["pass"] else 1


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Soak: {r['minutes']:g} minutes, a fault every {r['fault_every_s']:g} s", "",
             f"`{r['command']}` at {r['git_sha']} on {r['machine']}; {r['size']} at {r['fps']} fps, "
             f"`swapstream live` and `swapstream serve` with 2 API streams, through nginx-rtmp.", "",
             f"**{'PASS' if r['pass'] else 'FAIL'}**: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                                                                  for k, v in r["checks"].items()), "",
             "| at (s) | fault | recovery live / s1 / s2 (s) | max skew after live / s1 / s2 (ms) |",
             "|---|---|---|---|"]
    for f in r["faults"]:
        rec = " / ".join(str(f["recovery_s"][o]) for o in OUTPUTS)
        sk = " / ".join(str(f["max_abs_skew_ms_after"][o]) for o in OUTPUTS)
        lines.append(f"| {f['started_s']} | {f['kind']} | {rec} | {sk} |")
    lines += ["", "| process | RSS from → end (MB) | growth | fds | threads |", "|---|---|---|---|---|"]
    for name, v in r["resources"].items():
        if "rss_mb_from" in v:
            lines.append(f"| {name} | {v['rss_mb_from']} → {v['rss_mb_end']} | {v['rss_growth_pct']} % | "
                         f"{v['fds_from']} → {v['fds_end']} | {v['threads_from']} → {v['threads_end']} |")
    lines += ["", f"Latency p50 over all outputs: {r['latency_ms_p50_all']} ms.", "",
              f"![RSS over the run and recovery per fault]({r['plot']})", ""]
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path) -> None:
    """Resources over the run with each fault marked, and each fault's recovery per output."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), constrained_layout=True)
    for name, colour in (("live", "tab:blue"), ("serve", "tab:orange")):
        pts = [(s["t_s"] / 60, s[name]["rss_mb"]) for s in r["samples"] if s.get(name)]
        if pts:
            top.plot(*zip(*pts), color=colour, label=f"{name} RSS (MB)")
    for f in r["faults"]:
        top.axvline(f["started_s"] / 60, color="grey", lw=0.6, ls=":")
    top.set_xlabel("minutes")
    top.set_ylabel("RSS (MB)")
    top.set_title(f"Soak, {r['minutes']:g} min: RSS with each fault marked (dotted)")
    top.legend(loc="lower right")
    xs = np.arange(len(r["faults"]))
    for k, name in enumerate(OUTPUTS):
        ys = [f["recovery_s"][name] if f["recovery_s"][name] is not None else np.nan for f in r["faults"]]
        bottom.bar(xs + (k - 1) * 0.27, ys, width=0.27, label=name)
    bottom.axhline(RECOVERY_S, color="red", lw=0.8, label="5 s bar")
    bottom.set_xticks(xs, [f["kind"].replace("_", " ") for f in r["faults"]], rotation=60, fontsize=7)
    bottom.set_ylabel("recovery (s)")
    bottom.legend(fontsize=8, ncol=4)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
