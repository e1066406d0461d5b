"""`serve --workers N` on the CPU: real worker processes behind one control API on loopback.

What a user of the API must see: streams spread over the workers by load, one list, one /metrics
(valid Prometheus text, a `worker` label on every sample), a killed worker's streams running again on
another worker within 5 s with their source face, the crash in /metrics and the log with the stream
ids, a new worker in its place, and a 503 with every worker's reason when no worker can take a
stream.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import pytest

pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from swapstream.demo import astronaut  # noqa: E402
from swapstream.runtime.stream import StreamPipeline  # noqa: E402
from swapstream.runtime.workers import WorkerPool, merge_metrics  # noqa: E402

from ..helpers.wait import until  # noqa: E402
from .conftest import TOKEN, runtime_config  # noqa: E402


def _bench_api() -> type:
    """The stream benchmark's API client (tools/bench_streams.py): the tests call the API the same way."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_streams", Path(__file__).resolve().parents[2] / "tools"
                                                  / "bench_streams.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Api


class Pool(_bench_api()):  # type: ignore[misc]
    """The pool's front on loopback, with the API token, and the pool object behind it."""

    def __init__(self, url: str, pool: WorkerPool) -> None:
        super().__init__(url, TOKEN)
        self.url, self.pool = url, pool


def serve_pool(pool: WorkerPool) -> Iterator[Pool]:
    from aiohttp import web

    from swapstream.runtime.pool_api import mount_pool

    loop = asyncio.new_event_loop()
    app = web.Application()
    mount_pool(app, pool, TOKEN, upload_max_bytes=8 * 1024 * 1024)
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(app)
        try:
            loop.run_until_complete(runner.setup())  # starts the workers (on_startup)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        except BaseException as e:
            holder["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())  # stops the workers
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(120), "the worker pool did not start"
    if "error" in holder:
        raise holder["error"]
    try:
        yield Pool(f"http://127.0.0.1:{holder['port']}", pool)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        # No worker outlives the server.
        for w in pool.workers:
            assert w.proc is None or w.proc.returncode is not None, w.name


def make_pool(clip: tuple[Path, Any], tmp_path: Path, *overrides: str) -> WorkerPool:
    return WorkerPool(runtime_config(*overrides), devices=["cpu"], per_device=2,
                      hls_root=tmp_path / "hls", media_root=clip[0].parent)


@pytest.fixture
def pool(clip: tuple[Path, Any], tmp_path: Path) -> Iterator[Pool]:
    yield from serve_pool(make_pool(clip, tmp_path))


def stream(sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "input": {"file": "clip.mp4", "loop": True, "realtime": True},
            "outputs": [{"type": "null"}]} | extra


def face_png() -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(astronaut(), cv2.COLOR_RGB2BGR))
    assert ok
    return buf.tobytes()


def test_streams_spread_over_workers_behind_one_api(pool: Pool) -> None:
    for sid in ("a", "b", "c", "d"):
        status, info = pool.call("POST", "/api/streams", stream(sid))
        assert status == 201, info
    status, info = pool.call("PUT", "/api/streams/a/source", raw=face_png(), ctype="image/png")
    assert status == 200 and info["source"] == {"set": True, "version": 1}
    status, workers = pool.call("GET", "/api/workers")
    assert status == 200
    held = {w["name"]: w["streams"] for w in workers["workers"]}
    # The least loaded worker takes each new stream: two each, whatever the order.
    assert sorted(len(v) for v in held.values()) == [2, 2] and all(w["state"] == "ready" for w in workers["workers"])
    _, listed = pool.call("GET", "/api/streams")
    assert sorted(s["id"] for s in listed["streams"]) == ["a", "b", "c", "d"]
    assert {s["worker"] for s in listed["streams"]} == {"w0", "w1"}
    # A duplicate id is refused across workers, not only by the worker that holds it.
    status, info = pool.call("POST", "/api/streams", stream("c"))
    assert status == 409 and "already exists" in info["error"]
    # The face swapped in frames of stream a, decoded by its worker.
    until("faces swapped on stream a", 20,
          lambda: pool.call("GET", "/api/streams/a")[1]["faces_swapped"] > 0)
    status, text = pool.call("GET", "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out = [s for s in families["swapstream_frames_out"].samples]
    assert {s.labels["worker"] for s in out} == {"w0", "w1"}
    assert {s.labels["stream"] for s in out} == {"a", "b", "c", "d"}
    assert {s.labels["worker"]: s.value for s in families["swapstream_worker_up"].samples} == {"w0": 1, "w1": 1}
    # Validation is the workers' own, word for word.
    status, info = pool.call("POST", "/api/streams", {"input": {"file": "../x"}, "outputs": [{"type": "null"}]})
    assert status == 400 and "must be a relative name inside the media folder" in info["error"]
    status, info = pool.call("POST", "/api/streams", raw=b"{nope", ctype="application/json")
    assert status == 400 and "not valid JSON" in info["error"]
    for sid in ("a", "b", "c", "d"):
        status, info = pool.call("DELETE", f"/api/streams/{sid}")
        assert status == 200 and info["state"] == "stopped"
    assert pool.call("GET", "/api/streams")[1]["streams"] == []
    status, info = pool.call("GET", "/api/streams/a")
    assert status == 404


def test_a_killed_worker_s_streams_move_within_5_s(pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    for sid in ("x", "y"):
        assert pool.call("POST", "/api/streams", stream(sid))[0] == 201
        assert pool.call("PUT", f"/api/streams/{sid}/source", raw=face_png(), ctype="image/png")[0] == 200
    victim = pool.call("GET", "/api/streams/x")[1]["worker"]
    other = pool.call("GET", "/api/streams/y")[1]["worker"]
    assert victim != other
    until("frames out on x", 20, lambda: pool.call("GET", "/api/streams/x")[1]["frames_out"] > 5)
    pid = next(w.pid for w in pool.pool.workers if w.name == victim)
    assert pid is not None
    caplog.set_level(logging.WARNING)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()

    def moved() -> dict[str, Any] | None:
        status, info = pool.call("GET", "/api/streams/x")
        ok = status == 200 and info["worker"] == other and info["state"] == "running" and info["frames_out"] > 0
        return info if ok else None

    info = until("stream x running on the other worker", 10, moved)
    took = time.monotonic() - t0
    assert took <= 5.0, f"moving took {took:.1f} s"
    # With its source face: it is swapped again on the new worker.
    assert info["source"]["set"] is True
    until("faces swapped on the moved stream", 20,
          lambda: pool.call("GET", "/api/streams/x")[1]["faces_swapped"] > 0)
    # The other stream never stopped; the crash is reported with the streams it held.
    assert pool.call("GET", "/api/streams/y")[1]["state"] == "running"
    assert pool.call("GET", "/healthz")[0] == 200
    crashed = [r.getMessage() for r in caplog.records if "exited with code" in r.getMessage()]
    assert crashed and f"worker {victim}" in crashed[0] and "streams it held: x" in crashed[0]
    _, text = pool.call("GET", "/metrics")
    crashes = {s.labels["worker"]: s.value for f in text_string_to_metric_families(text)
               if f.name == "swapstream_worker_crashes" for s in f.samples}
    assert crashes[victim] == 1 and crashes[other] == 0
    # A new worker takes the dead one's place, and takes streams again.
    until("the restarted worker", 60, lambda: all(
        w["state"] == "ready" for w in pool.call("GET", "/api/workers")[1]["workers"]))
    status, info = pool.call("POST", "/api/streams", stream("z"))
    assert status == 201 and info["worker"] == victim


def test_no_worker_with_room_is_a_503_with_each_worker_s_reason(clip: tuple[Path, Any], tmp_path: Path) -> None:
    for served in serve_pool(make_pool(clip, tmp_path, "runtime.max_streams=1")):
        assert served.call("POST", "/api/streams", stream("a"))[0] == 201
        assert served.call("POST", "/api/streams", stream("b"))[0] == 201
        status, info = served.call("POST", "/api/streams", stream("c"))
        assert status == 503
        assert "no worker can take another stream" in info["error"]
        assert "w0: 1 streams" in info["error"] and "w1: 1 streams" in info["error"]
        # Nothing was half-created: the id is free for a later try.
        assert "c" not in served.pool.placed
        assert served.call("DELETE", "/api/streams/a")[0] == 200
        assert served.call("POST", "/api/streams", stream("c"))[0] == 201


def test_workers_over_their_latency_budget_take_no_new_stream(clip: tuple[Path, Any], tmp_path: Path) -> None:
    for served in serve_pool(make_pool(clip, tmp_path)):
        # A budget no CPU can meet: each worker gets one such stream, and both go over budget.
        for sid in ("slow0", "slow1"):
            status, info = served.call("POST", "/api/streams", stream(sid, budget_ms=0.5))
            assert status == 201, info
        until("both workers' load reports to show the budget missed", 20, lambda: all(
            "over its latency budget" in (w["refusal"] or "") for w in served.call("GET", "/api/workers")[1]["workers"]))
        status, info = served.call("POST", "/api/streams", stream("c"))
        assert status == 503, info
        assert "stream slow0 is over its latency budget" in info["error"]
        assert "stream slow1 is over its latency budget" in info["error"]
        assert "c" not in served.pool.placed


def test_merged_metrics_keep_each_family_together() -> None:
    a = ("# HELP m_total A counter.\n# TYPE m_total counter\nm_total{stream=\"s\"} 3.0\n"
         "# HELP g A gauge.\n# TYPE g gauge\ng 1.0\n")
    b = "# HELP m_total A counter.\n# TYPE m_total counter\nm_total{stream=\"t\"} 4.0\n"
    text = merge_metrics([("w0", a), ("w1", b)])
    assert text.splitlines() == [
        "# HELP m_total A counter.", "# TYPE m_total counter",
        'm_total{worker="w0",stream="s"} 3.0', 'm_total{worker="w1",stream="t"} 4.0',
        "# HELP g A gauge.", "# TYPE g gauge", 'g{worker="w0"} 1.0']
    fams = list(text_string_to_metric_families(text))
    assert [f.name for f in fams] == ["m", "g"]


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGTERM)], ids=["term", "int_then_term"])
def test_serve_with_workers_from_the_command_line(clip: tuple[Path, Any], tmp_path: Path,
                                                  signals: tuple[int, ...]) -> None:
    """`swapstream serve --workers 1` as a user starts it: the API answers for its worker's streams,
    and stopping the server (SIGTERM; or Ctrl+C and then a SIGTERM while it stops, as a script's
    time limit does) stops the worker too, quietly."""
    import socket
    import subprocess
    import sys

    face = tmp_path / "face.png"
    face.write_bytes(face_png())
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "swapstream.cli", "serve", "-s", str(face), "--port", str(port),
                             "--workers", "1", "--media-root", str(clip[0].parent), "--api-token-file",
                             str(token_file), "--config", "multi_stream"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = Pool(f"http://127.0.0.1:{port}", None)  # type: ignore[arg-type]
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                return served.call("GET", "/readyz")[0] == 200
            except OSError:
                return False

        until("serve --workers 1 to be ready", 120, ready)
        status, info = served.call("POST", "/api/streams", stream("cli"))
        assert status == 201 and info["worker"] == "w0", info
        workers = served.call("GET", "/api/workers")[1]["workers"]
        pid = workers[0]["pid"]
        until("frames out", 20, lambda: served.call("GET", "/api/streams/cli")[1]["frames_out"] > 0)
    finally:
        for k, sig in enumerate(signals):
            if k:
                time.sleep(0.02)  # while the server stops (fails without the guard: 0.2 s is too late)
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode is not None
    assert "1 worker process(es) on each of cpu" in out
    # The worker's session and pipes were closed before the loop was: nothing left for the
    # interpreter to complain about, and no traceback.
    for noise in ("Unclosed", "Traceback", "Exception ignored"):
        assert noise not in out, out[-3000:]
    # The worker went with the server.
    until("the worker to exit", 20, lambda: not Path(f"/proc/{pid}").exists()
          or "zombie" in Path(f"/proc/{pid}/status").read_text().lower())


def test_workers_on_two_devices_share_the_streams(clip: tuple[Path, Any], tmp_path: Path) -> None:
    """Two devices (simulated: `cpu:0`, `cpu:1`), one worker each: streams are placed by headroom
    on both, each worker says which device it is on, and /metrics has both workers."""
    pool = WorkerPool(runtime_config(), devices=["cpu:0", "cpu:1"], per_device=1,
                      hls_root=tmp_path / "hls", media_root=clip[0].parent)
    for served in serve_pool(pool):
        for sid in ("a", "b"):
            assert served.call("POST", "/api/streams", stream(sid))[0] == 201
        workers = served.call("GET", "/api/workers")[1]["workers"]
        assert {w["device"]: len(w["streams"]) for w in workers} == {"cpu:0": 1, "cpu:1": 1}
        status, text = served.call("GET", "/metrics")
        up = {s.labels["device"]: s.value for f in text_string_to_metric_families(text)
              if f.name == "swapstream_worker_up" for s in f.samples}
        assert up == {"cpu:0": 1, "cpu:1": 1}


class _Reported:
    """What `load_report` reads of a stream: its latencies (as StreamPipeline keeps them) and times."""

    latency_window = StreamPipeline.latency_window

    def __init__(self, sid: str, latencies: list[tuple[float, float]], changed_mono: float) -> None:
        self.id, self.state, self.budget_ms = sid, "running", 33.0
        self.created = time.time() - 60.0
        self.changed_mono = changed_mono
        self.latency_timed = deque(latencies)

    def arrival_phase(self) -> float | None:
        return None


def test_frames_behind_a_stream_start_do_not_refuse_new_streams() -> None:
    from swapstream.runtime.worker import START_SETTLE_S, load_report

    now = time.monotonic()
    # Stream "old" ran within budget (10 ms) until "new" started 3 s ago; its frames that arrived
    # during the start waited 80 ms. Those that arrived after the start had settled are on time.
    stalled = [(now - 3.0 + i * 0.03 + 0.08, 80.0) for i in range(int(START_SETTLE_S / 0.03))]
    settled = [(now - 1.5 + i * 0.03, 10.0) for i in range(40)]
    old = _Reported("old", stalled + settled, changed_mono=now - 120.0)
    new = _Reported("new", [], changed_mono=now - 3.0)
    runtime = SimpleNamespace(streams={"old": old, "new": new}, active=lambda: 2, slots=[],
                              config=SimpleNamespace(runtime=SimpleNamespace(min_samples=10, max_streams=8)))
    report = load_report(runtime)
    assert report["p99_over_budget"] == {"old": round(10.0 / 33.0, 3)}
    # Without a recent start the same stalled frames count: the worker is over budget.
    new.changed_mono = now - 120.0
    assert load_report(runtime)["p99_over_budget"]["old"] == round(80.0 / 33.0, 3)


def test_a_load_report_gives_each_requested_swappers_cost() -> None:
    """`load_report`'s `costs`: the busier slot's busy share split by its streams' shares of the swap
    thread, keyed by the swapper each stream asked for, its settled running streams only."""
    from swapstream.runtime.worker import LOAD_GRACE_S, load_report

    slot = SimpleNamespace(name="cuda:1", busy=lambda window=5.0: 0.5,
                           stream_shares=lambda window=5.0: {"a": 0.6, "b": 0.2, "young": 0.2})
    idle = SimpleNamespace(name="cuda:0", busy=lambda window=5.0: 0.1, stream_shares=lambda window=5.0: {"z": 1.0})

    def stream(sid: str, swapper: str, age: float, on: object = slot) -> SimpleNamespace:
        s = _Reported(sid, [], changed_mono=time.monotonic() - 120.0)
        s.created = time.time() - age
        return SimpleNamespace(**vars(s), latency_window=lambda *a, **k: {"p99": None, "frames": 0},
                               arrival_phase=lambda: None, slot=on, spec=SimpleNamespace(swapper=swapper),
                               # A controller step may have moved it to mesh: its request's swapper counts.
                               backend_name="mesh")

    streams = {"a": stream("a", "inswapper_128", 60.0), "b": stream("b", "inswapper_128", 60.0),
               "young": stream("young", "mesh", LOAD_GRACE_S / 2), "z": stream("z", "mesh", 60.0, idle)}
    runtime = SimpleNamespace(streams=streams, active=lambda: 4, slots=[idle, slot],
                              config=SimpleNamespace(runtime=SimpleNamespace(min_samples=10, max_streams=8)))
    report = load_report(runtime)
    assert report["busy"] == 0.5
    assert report["costs"] == {"inswapper_128": pytest.approx(0.2)}  # (0.5 x 0.6 + 0.5 x 0.2) / 2
