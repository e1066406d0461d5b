"""One worker process of `swapstream serve --workers N`: a `StreamRuntime` and its control API on a
private Unix socket, driven by the parent (`runtime.workers.WorkerPool`).

The parent writes the worker's settings (config, device, token, socket, folders) to a file in a folder
only its user can read, and passes the file's path: the token never appears in `ps`. The worker reads
the file, deletes it, builds its runtime on the one device it was given, listens, and prints one
JSON line `{"ready": PID}` on standard output. It stops on SIGTERM or SIGINT, and when its standard
input closes: a parent that died must not leave workers holding a GPU.

Besides the control API of `runtime.api` (which the parent forwards requests to), the worker answers
`GET /worker/load` with what placement needs (runtime.placement): its streams, its device thread's
busy share, how far its streams are from their latency budgets, their arrival phases and whether its
models verify. `build_app` is shared with the Ray actor of `serve --ray` (runtime.cluster), which
serves the same app over TCP on its node.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .placement import mean_by_swapper

log = logging.getLogger(__name__)

LOAD_WINDOW_S = 5.0
"""The latency window a worker's load report judges its streams by."""
LOAD_GRACE_S = 5.0
"""A stream's first seconds, which its worker's load report leaves out."""
START_SETTLE_S = 1.0
"""How long after a stream's one-time work on the device (its start, a source face's identity) the
other streams' frames are still left out of the load report: that work holds the device thread
for up to some hundreds of milliseconds, and the queue behind it takes as long again to drain."""


class ModelCheck:
    """Whether this worker's built-in face models are in place and pass their SHA-256 check, re-read
    only when a file changes (size or time): it runs with every load report, and a node that joined
    without its models must be seen the moment they are installed."""

    def __init__(self, models_dir: Path | None) -> None:
        self.models_dir = models_dir
        self._seen: tuple[Any, ...] | None = None
        self._answer: str | None = None

    def _stamp(self) -> tuple[Any, ...]:
        from ..engines.builtin import default_models_dir, required_models

        folder = self.models_dir or default_models_dir()
        out: list[Any] = [str(folder)]
        for name in required_models():
            try:
                st = (folder / name).stat()
                out.append((name, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((name, None))
        return tuple(out)

    def __call__(self) -> str | None:
        """None when every built-in model verifies, else why not (with the fix)."""
        from ..engines.builtin import builtin_model_path, required_models
        from ..errors import ModelMissingError

        stamp = self._stamp()
        if stamp != self._seen:
            self._seen, self._answer = stamp, None
            for name in required_models():
                try:
                    builtin_model_path(name, self.models_dir)
                except ModelMissingError as e:
                    self._answer = str(e)
                    break
        return self._answer


def load_report(runtime: Any, models: str | None = None) -> dict[str, Any]:
    """What the parent places streams by: running streams, the busiest device thread's share of the
    last seconds, each stream's p99 over its last frames against its budget (once it has enough
    frames to judge), each stream's arrival phase, and `models`: why its models do not verify
    (None: they do, `ModelCheck`)."""
    ratios: dict[str, float] = {}
    phases: dict[str, float] = {}
    now = time.time()
    streams = list(runtime.streams.values())
    # Frames that arrived while a stream was starting waited behind its one-time work: counting them
    # refused streams during a ramp while every stream fitted in steady state (an H200 run refused
    # the 26th of 32 streams so). A worker that keeps starting streams is judged by its busy share.
    settled = max((p.changed_mono for p in streams), default=0.0) + START_SETTLE_S
    for p in streams:
        if p.state == "running" and (phase := p.arrival_phase()) is not None:
            phases[p.id] = phase
        # The frames of the last seconds, whatever the controller did meanwhile (its own window
        # restarts at each step, and a stream it keeps stepping down is exactly one whose worker is
        # full); a stream's first seconds are left out: its decoder and first frames say nothing
        # about the worker's room, and counting them refused streams that would have fitted.
        if p.state != "running" or now - p.created < LOAD_GRACE_S:
            continue
        w = p.latency_window(LOAD_WINDOW_S, arrived_after=settled)
        if w["p99"] is None or w["frames"] < runtime.config.runtime.min_samples:
            continue
        ratios[p.id] = round(w["p99"] / p.budget_ms, 3)
    # The streams whose device time the busy share (a LOAD_WINDOW_S average) already holds: placement
    # divides by these for a stream's cost (divided by streams still starting, a burst's first
    # report made a stream look nearly free).
    settled_n = sum(1 for p in streams if p.state == "running" and now - p.created >= LOAD_GRACE_S)
    busy = 0.0
    costs: dict[str, float] = {}
    if runtime.slots:
        busy, slot = max(((s.busy(LOAD_WINDOW_S), s) for s in runtime.slots), key=lambda bs: bs[0])
        # Keyed by the swapper each stream asked for (a create request's), not the one a controller
        # step may have put it on: the parent charges a new stream by what its request says.
        costs = swapper_costs(busy, slot.stream_shares(LOAD_WINDOW_S),
                              {p.id: p.spec.swapper for p in streams if p.slot is slot and p.state == "running"
                               and now - p.created >= LOAD_GRACE_S})
    return {"streams": runtime.active(), "settled": settled_n, "max_streams": runtime.config.runtime.max_streams,
            "busy": round(busy, 3), "costs": costs,
            "p99_over_budget": ratios, "phases": phases, "devices": [s.name for s in runtime.slots],
            "models": models}


def swapper_costs(busy: float, shares: dict[str, float], settled: dict[str, str]) -> dict[str, float]:
    """What one settled stream of each swapper adds to `busy`: each stream's part of it is its share
    of the swap thread's time (`shares`, by stream id), and a swapper's cost the mean part of its
    settled streams (`settled`: stream id -> the swapper it asked for). Placement charges a new stream
    its swapper's cost: a mesh stream holds a GPU's device thread several times as long as a neural
    one. Streams still starting are left out (their first frames say nothing of their cost), as are
    streams without a batch in the window (no face yet). `busy` is the busier of the device's
    threads; where analysis is the busier, its time (the same for every swapper) is split as the
    swap thread's is, which overcharges the costlier swapper: a margin, not a saving."""
    means = mean_by_swapper((swapper, busy * shares[sid]) for sid, swapper in settled.items() if sid in shares)
    return {k: round(v, 4) for k, v in means.items()}


def build_app(settings: dict[str, Any]) -> tuple[Any, Any]:
    """The worker's aiohttp app (the control API of `runtime.api` and `/worker/load`) and its runtime,
    from the settings the parent gave; the caller serves it (a Unix socket here, TCP in a Ray actor)."""
    from aiohttp import web

    from ..config import Config
    from .api import ApiSettings, authorize, mount_runtime
    from .manager import StreamRuntime
    from .metrics import GpuMonitor

    cfg = Config.model_validate(settings["config"])
    # NVML numbers the host's GPUs, CUDA the visible ones: this worker's GPU is CUDA's device 0 and
    # NVML's `nvml_index` (None: unknown, e.g. a MIG or UUID name; its utilisation is then not read).
    nvml = settings.get("nvml_index")
    gpu = GpuMonitor(only=nvml) if settings["device"].startswith("cuda") and nvml is not None else None
    runtime = StreamRuntime(cfg, devices=[settings["device"]], gpu=gpu)
    token = settings["token"]
    api = ApiSettings(token, hls_root=Path(settings["hls_root"]) if settings.get("hls_root") else None,
                      media_root=Path(settings["media_root"]) if settings.get("media_root") else None,
                      default_source=Path(settings["default_source"]) if settings.get("default_source") else None)
    app = web.Application(client_max_size=settings.get("client_max_size", 16 * 1024 * 1024))
    mount_runtime(app, runtime, api)
    models = ModelCheck(cfg.models_dir)
    whip = whip_endpoints(app, runtime, settings, cfg, api.default_image)

    async def load(request: web.Request) -> web.Response:
        refused = authorize(request, token)
        if refused is not None:
            return refused
        # Off the loop: a changed model file is hashed (megabytes) while streams run. The streams
        # are read on the loop, which is the only writer of their state.
        problem = await asyncio.get_running_loop().run_in_executor(None, models)
        report = load_report(runtime, problem)
        if whip is not None:  # the parent's count of sessions against --max-sessions (whip_relay)
            report["rtc_sessions"] = list(whip.sessions) + list(whip.viewers)
        return web.json_response(report)

    app.router.add_get("/worker/load", load)
    return app, runtime


def whip_endpoints(app: Any, runtime: Any, settings: dict[str, Any], cfg: Any, image: Any) -> Any:
    """With `settings["whip"]` (serve --workers N with WebRTC): this worker's own WHIP and WHEP
    endpoints under `/worker/rtc`, behind its token, to which the parent hands the offers it checked
    (runtime.whip_relay); each publisher a stream of this worker's runtime, with serve's face
    (`image`, read once for the API's streams too). Returns the `WhipServer`, or None."""
    whip = settings.get("whip")
    if whip is None:
        return None
    from ..live.webrtc import WhipServer
    from .rtc import RuntimePublishers
    from .whip_relay import WORKER_HOST, WORKER_RTC_PREFIX

    source = Path(settings["default_source"])
    # Serve's own config (the worker's), as in one process.
    media = RuntimePublishers(runtime, image=image, image_name=f"the server's source image '{source}'",
                              image_path=source)
    # The parent enforces --max-sessions over all workers; this cap only bounds one worker.
    server = WhipServer(media, token=settings["token"], max_sessions=whip["max_sessions"],
                        settings=cfg.webrtc, host=WORKER_HOST)
    app.add_subapp(WORKER_RTC_PREFIX, server.app)
    return server


async def serve(settings: dict[str, Any]) -> None:
    from aiohttp import web

    app, _runtime = build_app(settings)
    runner = web.AppRunner(app, access_log=None)  # the parent logs what clients asked
    await runner.setup()
    site = web.UnixSite(runner, settings["socket"])
    await site.start()
    os.chmod(settings["socket"], 0o600)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def parent_gone() -> None:
        # Blocks until the parent closes our standard input (or dies, which closes it).
        try:
            sys.stdin.buffer.read()
        finally:
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=parent_gone, name="parent-watch", daemon=True).start()
    # What start-up built (networks, CUDA graphs, modules: millions of objects that live as long
    # as the worker) leaves the collector's view: a full collection scanning them would pause
    # every stream of this process at once. This process is the worker's alone.
    gc.collect()
    gc.freeze()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m swapstream.runtime.worker SETTINGS_FILE (started by swapstream serve "
              "--workers N, not by hand)", file=sys.stderr)
        return 2
    path = Path(args[0])
    settings = json.loads(path.read_text())
    path.unlink()  # it holds the worker's token: read once, then gone
    logging.basicConfig(level=os.environ.get("SWAPSTREAM_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s {settings['name']} %(levelname)s %(name)s: %(message)s")
    from ..redact import install_log_redaction

    install_log_redaction()  # every line, the libraries' too, without stream keys or tokens
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
