"""`swapstream serve --workers N`: N worker processes per device, one server to the outside.

```
serve (parent: control plane)                     worker processes (runtime.worker)
 ├─ control API, /metrics, /dashboard, /hls  ──►   w0  StreamRuntime on cuda:0  (Unix socket)
 ├─ WorkerPool: start, watch, restart          ──►   w1  StreamRuntime on cuda:0
 ├─ placement: least loaded worker, by reports ──►   w2  StreamRuntime on cuda:1 ...
 └─ one MPS control daemon per GPU (workers are its clients)
```

A stream lives in one worker: its frames never leave that process or its GPU. The parent places a
new stream on the worker with the most headroom by what the workers report (`/worker/load`: the
device thread's busy share and each stream's p99 against its budget) and by the streams it has
placed there since, and forwards every request about the stream to that worker. A worker that is
over budget takes no new stream; when none can, the request gets 503 with each worker's reason.

The parent keeps what it needs to start a stream again: the request that created it and the last
source face uploaded for it. When a worker dies, its streams are created again on the other workers
(RTMP inputs are pulled again, outputs reconnect to the same URLs, HLS goes on in the same folder),
the crash is logged with the stream ids and counted in /metrics, and a new worker is started in its
place. HLS is served by the parent from the shared `--hls-root` with view keys of its own, so a
player's URL survives a move.

The launcher is the part that starts, watches and stops workers (`_prepare`, `_launch`, `_exited`,
`_stop`, `_restart_delay`): local processes here, Ray actors across machines in `runtime.cluster`
(`serve --ray`). Placement (`runtime.placement`), forwarding and failover are the same for both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import Config
from .api import CreateBody
from .placement import Headroom, NoRoom, choose, headroom, refusal, stream_cost

log = logging.getLogger(__name__)

WorkerState = Literal["starting", "ready", "dead", "stopped"]

START_TIMEOUT_S = 600.0
"""A worker's start: importing the stack and, on a GPU, CUDA's context and the warm-up (analysis,
kernels, the configured swapper's and mesh's swap backends); other backends build on first use."""
WORKER_STOP_S = 20.0
"""How long a worker has to stop its streams and exit when the server stops, before it is killed."""
MAX_MOVES = 3
"""A stream whose workers died this many times under it is not started again: it may be what kills
them (an input that crashes a decoder), and moving it on would take its next worker down too."""
TOMBSTONE_S = 30.0
"""How long a deleted stream's id stays with its worker: a DELETE answers while the stream may
still be stopping there, and its id (and HLS folder) must not start on another worker meanwhile."""
SECRET_ENV = ("SWAPSTREAM_API_TOKEN", "SWAPSTREAM_API_TOKEN_FILE", "SWAPSTREAM_WHIP_TOKEN",
              "SWAPSTREAM_WHIP_TOKEN_FILE")
"""The server's own secrets, which its workers do not need (each gets a token of its own)."""
WATCH_INTERVAL_S = 0.2
"""How often the parent looks for dead workers: a move within 5 s needs the death seen at once."""
LOAD_INTERVAL_S = 1.0
"""How often each worker's load report is refreshed."""


@dataclass
class Worker:
    """One worker process as the parent sees it."""

    name: str
    device: str
    """The device as the parent names it ("cpu", "cuda:1")."""
    env: dict[str, str]
    socket: str = ""
    token: str = ""
    state: WorkerState = "starting"
    proc: asyncio.subprocess.Process | None = None
    session: Any = None
    """aiohttp ClientSession over the worker's Unix socket (or, in a cluster, TCP to `base`)."""
    base: str = "http://worker"
    """Where its API is: any host over a Unix socket; a cluster worker's node address and port."""
    proc_pid: int | None = None
    """Its process id where it is not our child (a Ray actor's, on its node)."""
    load: dict[str, Any] = field(default_factory=dict)
    load_at: float = 0.0
    headroom: Headroom = field(default_factory=Headroom)
    """`load` summed up for placement (runtime.placement), at each report."""
    crashes: int = 0
    last_exit: int | None = None
    started: float = 0.0
    node: str | None = None
    """The machine it runs on, for a cluster (runtime.cluster: the Ray node's id); None: this one."""
    node_ip: str | None = None
    handle: Any = None
    """The launcher's own handle of it (runtime.cluster: the Ray actor)."""
    death: Any = None
    """The launcher's sign of its death (runtime.cluster: a future that completes when the actor dies)."""
    mps_client: bool | None = None
    """Whether its GPU's MPS daemon lists it as a client once it is ready (None: no MPS, or not
    known): a CUDA process that cannot reach the daemon runs without MPS and says nothing."""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.proc_pid


@dataclass
class Placed:
    """A stream the parent placed: where it is and what starts it again elsewhere."""

    id: str
    worker: Worker
    body: dict[str, Any]
    """The create request, with its id."""
    view_key: str
    source: tuple[bytes, str] | None = None
    """The last source face uploaded: (request body, Content-Type)."""
    moves: int = 0
    lost: str | None = None
    """Why the stream could not be started again after its worker died (None: it runs)."""
    gave_up: bool = False
    """Not to be started again (MAX_MOVES): only a DELETE clears it."""


class PoolError(Exception):
    """A request the pool cannot serve: `status` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WorkerPool:
    """Starts, watches and restarts the worker processes, and places streams on them."""

    def __init__(self, config: Config, *, devices: Sequence[str], per_device: int,
                 hls_root: Path | None = None, media_root: Path | None = None,
                 mps: bool = False, python: str = sys.executable,
                 default_source: Path | None = None, whip: dict[str, Any] | None = None) -> None:
        if per_device < 1:
            raise ValueError(f"per_device must be at least 1, got {per_device}")
        self.config = config
        self.hls_root = hls_root
        self.media_root = media_root
        self.default_source = default_source
        """serve -s: the image whose face each worker's new streams start with (ApiSettings)."""
        self.whip = whip
        """WHIP and WHEP in the workers (runtime.whip_relay): `max_sessions` for each worker's own
        endpoint; None: no WebRTC. Needs `default_source`, the publishers' face."""
        if whip is not None and default_source is None:
            raise ValueError("WHIP in the workers needs default_source, the publishers' face")
        self.python = python
        self.mps = mps
        self._dir = Path(tempfile.mkdtemp(prefix="swapstream-workers-"))
        os.chmod(self._dir, 0o700)  # sockets and settings files: this user's only
        self._exit = ExitStack()
        self.workers: list[Worker] = []
        self._device_env: dict[str, dict[str, str]] = {}
        for d in devices:
            for k in range(per_device):
                self.workers.append(Worker(f"w{len(self.workers)}", d, {}))
        self.placed: dict[str, Placed] = {}
        self._reserved: set[str] = set()
        self._pending: dict[str, Worker] = {}
        """Streams being created, by the worker chosen for them."""
        self._tombstones: dict[str, tuple[Worker, float]] = {}
        """Deleted ids that may still be stopping: (their worker, until when, monotonic)."""
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.relay: Any = None
        """The WHIP relay (runtime.whip_relay.PoolRelay) that places publishers here, if any."""
        self.closing = False
        self.crashes_total = 0

    # -- life cycle -----------------------------------------------------------------------------

    def _env_for(self, device: str) -> dict[str, str]:
        """The environment of a worker on `device`: one GPU visible (as cuda:0), and the MPS daemon
        of that GPU when MPS is on. Daemons start once per GPU."""
        env = self._device_env.get(device)
        if env is not None:
            return env
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        m = re.fullmatch(r"cuda:(\d+)", device)
        if m:
            # cuda:N is the parent's N-th visible GPU: the same one in the worker, whatever the
            # parent was given (CUDA_VISIBLE_DEVICES=2,3 makes cuda:0 the host's GPU 2).
            visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[int(m.group(1))] if visible else m.group(1)
            if self.mps:
                from ..gpu.mps import mps_daemon

                env = self._exit.enter_context(mps_daemon(base_env=env))
        self._device_env[device] = env
        return env

    async def start(self) -> None:
        """Start every worker and wait until all are ready (or raise naming the one that failed)."""
        from ..errors import ConfigError, SwapStreamError
        from ..gpu.mps import MpsError

        loop = asyncio.get_running_loop()
        try:
            await self._prepare()
            # All at once, even when they compile: one worker alone first, so that the others
            # load torch.compile's on-disk cache, was measured slower on the H200 (390.5 s to start
            # 8 face-stack workers against 298.5 s at once: the first one's compile took 270 s
            # alone, mostly single-threaded work, and a start from the cache still about 105 s).
            await asyncio.gather(*(self._spawn(w) for w in self.workers))
            await self._check_mps(self.workers)
        except BaseException as e:
            await self.close()
            # The server cannot start: one line for the user, not a traceback.
            if isinstance(e, MpsError):
                raise ConfigError(f"--mps: {e}") from None
            if isinstance(e, PoolError):
                raise SwapStreamError(str(e)) from None
            raise
        self._tasks = [loop.create_task(self._watch(), name="workers-watch"),
                       loop.create_task(self._refresh_loads(), name="workers-load")]

    async def _check_mps(self, workers: Sequence[Worker]) -> None:
        """Ask each MPS daemon we started which processes are its clients, and say which of
        `workers` (ready, so they have initialised CUDA) are not: those time-slice the GPU."""
        if not self.mps:
            return
        from ..gpu.mps import MpsError, client_pids

        loop = asyncio.get_running_loop()
        for device in sorted({w.device for w in workers}):
            env = self._device_env.get(device)
            if env is None or not env.get("CUDA_MPS_PIPE_DIRECTORY"):
                continue
            on = [w for w in workers if w.device == device]
            try:
                clients = await loop.run_in_executor(None, client_pids, env)
            except MpsError as e:
                log.warning("MPS on %s: could not ask which workers are its clients: %s", device, e)
                continue
            for w in on:
                w.mps_client = w.pid in clients
            missing = [w.name for w in on if not w.mps_client]
            if missing:
                log.warning("MPS on %s: worker(s) %s are not clients of its daemon, so the GPU time-slices "
                            "them (their small kernels wait for each other's slices); check that nothing "
                            "resets CUDA_MPS_PIPE_DIRECTORY for them, or run with --no-mps", device,
                            ", ".join(missing))
            else:
                log.info("MPS on %s: all %d worker(s) are clients of its daemon", device, len(on))

    # -- the launcher: local worker processes (runtime.cluster overrides these for Ray actors) ----

    async def _prepare(self) -> None:
        """Before the first worker starts: each device's environment (and its MPS daemon)."""
        loop = asyncio.get_running_loop()
        for w in self.workers:
            w.env = await loop.run_in_executor(None, self._env_for, w.device)

    def _exited(self, w: Worker) -> bool:
        """Whether a ready worker has died."""
        return w.proc is not None and w.proc.returncode is not None

    def _restart_delay(self, w: Worker) -> float:
        # 0.5, 1, 2, 4... s, at most 30: a worker that keeps dying does not spin the machine.
        return min(30.0, 0.25 * 2.0 ** min(w.crashes, 8))

    async def _spawn(self, w: Worker) -> None:
        """Start `w` (again) and connect to it; ready when this returns."""
        w.state = "starting"
        w.started = time.monotonic()
        await self._launch(w)
        w.state = "ready"
        w.load, w.headroom = {}, Headroom()
        log.info("worker %s (pid %s) ready on %s%s in %.1f s", w.name, w.pid, w.device,
                 f" on node {w.node}" if w.node else "", time.monotonic() - w.started)

    async def _launch(self, w: Worker) -> None:
        """Start `w`'s process and open its session (its API over a Unix socket)."""
        import aiohttp

        w.token = secrets.token_urlsafe(24)
        w.socket = str(self._dir / f"{w.name}-{secrets.token_hex(4)}.sock")
        # A GPU worker sees its one GPU as cuda:0 (CUDA_VISIBLE_DEVICES); "cpu:N" names a simulated
        # device (tests of placement over several devices on a machine without GPUs).
        visible = w.env.get("CUDA_VISIBLE_DEVICES", "")
        settings = {"name": w.name, "device": "cuda:0" if w.device.startswith("cuda") else "cpu",
                    "nvml_index": int(visible) if visible.isdigit() else None,
                    "socket": w.socket, "token": w.token, "config": self.config.model_dump(mode="json"),
                    "hls_root": str(self.hls_root) if self.hls_root else None,
                    "media_root": str(self.media_root) if self.media_root else None,
                    "default_source": str(self.default_source.resolve()) if self.default_source else None,
                    "whip": self.whip}
        path = self._dir / f"{w.name}-{secrets.token_hex(4)}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(settings, f)
        # Its own session: a Ctrl+C at the terminal reaches the server, which stops the workers
        # (through their standard input), instead of killing them under it as if they crashed.
        w.proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "swapstream.runtime.worker", str(path), env=w.env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
        w.started = time.monotonic()
        assert w.proc.stdout is not None
        deadline = w.started + START_TIMEOUT_S
        while True:  # a library may print before the ready line
            try:
                line = await asyncio.wait_for(w.proc.stdout.readline(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                w.proc.kill()
                raise PoolError(503, f"worker {w.name} on {w.device} did not start in {START_TIMEOUT_S:.0f} s") from None
            if not line:
                code = await w.proc.wait()
                raise PoolError(503, f"worker {w.name} on {w.device} exited while starting (code {code}); "
                                     f"its error is in the log above")
            if line.startswith(b'{"ready"'):
                break
            sys.stderr.write(line.decode(errors="replace"))
        # What it prints later goes to our standard error: an unread pipe would block it when full.
        self._tasks.append(asyncio.get_running_loop().create_task(self._relay_output(w.proc)))
        if w.session is not None:
            await w.session.close()
        w.session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=w.socket),
                                          headers={"Authorization": f"Bearer {w.token}"})

    @staticmethod
    async def _relay_output(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            sys.stderr.write(line.decode(errors="replace"))

    async def close(self) -> None:
        self.closing = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

        async def stop(w: Worker) -> None:
            await self._stop(w)
            if w.session is not None:
                await w.session.close()
            w.state = "stopped"

        await asyncio.gather(*(stop(w) for w in self.workers), return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._exit.close)  # MPS daemons
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _stop(self, w: Worker) -> None:
        if w.proc is not None and w.proc.returncode is None:
            assert w.proc.stdin is not None
            w.proc.stdin.close()  # the worker stops its streams and exits
            try:
                await asyncio.wait_for(w.proc.wait(), WORKER_STOP_S)
            except asyncio.TimeoutError:
                log.warning("worker %s (pid %s) did not stop in %.0f s: killed", w.name, w.pid, WORKER_STOP_S)
                w.proc.kill()
                await w.proc.wait()

    # -- watching ---------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while not self.closing:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for w in self.workers:
                if self.closing:
                    return
                if w.state == "ready" and self._exited(w):
                    try:
                        await self._crashed(w)
                    except Exception:  # the watch must outlive the handling of any one exit
                        log.exception("handling the exit of worker %s failed", w.name)

    async def _crashed(self, w: Worker) -> None:
        w.state = "dead"
        w.crashes += 1
        w.last_exit = w.proc.returncode if w.proc is not None else None
        self.crashes_total += 1
        held = sorted((p for p in self.placed.values() if p.worker is w and p.lost is None), key=lambda p: p.id)
        where = w.device + (f" on node {w.node}" if w.node else "")
        # Its WHIP publishers' streams went with it (their connections were its own): they are not
        # moved, their publishers reconnect and are placed again.
        publishers = self.relay.streams_of(w) if self.relay is not None else []
        log.error("worker %s (pid %s, %s) exited with code %s; streams it held: %s%s", w.name, w.pid,
                  where, w.last_exit, ", ".join(p.id for p in held) or "none",
                  f"; WHIP publishers' streams, ended: {', '.join(publishers)}" if publishers else "")
        # Its replacement starts at once, beside the moves; the moves run together, so a worker
        # that held many streams does not make the last of them wait for all the others.
        self._tasks.append(asyncio.get_running_loop().create_task(self._restart(w), name=f"restart-{w.name}"))
        # Each stream's arrival phase as its worker last saw it: placed where it collides least.
        phases = w.load.get("phases") or {}
        await asyncio.gather(*(self._move(p, exclude=w, phase=phases.get(p.id)) for p in held))

    async def _restart(self, w: Worker) -> None:
        await asyncio.sleep(self._restart_delay(w))
        if self.closing:
            return
        try:
            await self._spawn(w)
        except Exception as e:  # the pool goes on with the workers it has
            w.state = "dead"
            log.error("worker %s could not be started again: %s", w.name, e)
            return
        await self._check_mps([w])
        # Streams that found no room when their worker died get another chance on the new one.
        lost = [p for p in self.placed.values() if p.lost is not None and not p.gave_up]
        await asyncio.gather(*(self._move(p, exclude=None) for p in lost))

    async def _move(self, p: Placed, exclude: Worker | None, phase: float | None = None) -> None:
        """Create a dead worker's stream again on another worker, with its source face."""
        dead = p.worker.name
        if p.moves >= MAX_MOVES:
            p.gave_up = True
            p.lost = (f"its workers died {p.moves + 1} times under it, so it is not started again (its "
                      f"input may be what crashes them): delete it, and check the input")
            log.error("stream %s: %s", p.id, p.lost)
            return
        try:
            target = self.choose(exclude=exclude, phase=phase, swapper=self.swapper_of(p.body))
            self._pending[p.id] = target  # counted there while it is being created
            try:
                status, _, payload = await self.forward(target, "POST", "/api/streams", json.dumps(p.body).encode(),
                                                        "application/json", timeout=60.0)
                if status != 201:
                    raise PoolError(status, _error_text(payload))
                # Its face before anyone is sent there: a stream that answers without it would be
                # passing frames through unswapped.
                if p.source is not None:
                    status, _, payload = await self.forward(target, "PUT", f"/api/streams/{p.id}/source",
                                                            p.source[0], p.source[1], timeout=60.0)
                    if status != 200:
                        log.error("stream %s: its source face was not accepted again on %s: %s", p.id,
                                  target.name, _error_text(payload))
            finally:
                self._pending.pop(p.id, None)
            if self.placed.get(p.id) is not p:  # deleted meanwhile: undo
                await self.forward(target, "DELETE", f"/api/streams/{p.id}")
                return
            p.worker, p.moves, p.lost = target, p.moves + 1, None
            log.warning("stream %s moved to worker %s", p.id, target.name)
        except PoolError as e:
            p.lost = f"its worker {dead} died and no other worker could take it yet: {e}"
            log.error("stream %s: %s", p.id, p.lost)

    async def _refresh_loads(self) -> None:
        while not self.closing:
            await asyncio.gather(*(self._refresh(w) for w in self.workers if w.state == "ready"),
                                 return_exceptions=True)
            await asyncio.sleep(LOAD_INTERVAL_S)

    async def _refresh(self, w: Worker) -> None:
        status, _, payload = await self.forward(w, "GET", "/worker/load", timeout=5.0)
        if status == 200:
            w.load, w.load_at = json.loads(payload), time.monotonic()
            w.headroom = headroom(w.load)

    # -- placement ------------------------------------------------------------------------------

    def streams_on(self, w: Worker) -> int:
        """Streams placed on `w`, those being created there included: a burst of creates must
        spread before the workers' next load reports show them."""
        return (sum(1 for p in self.placed.values() if p.worker is w and p.lost is None)
                + sum(1 for x in self._pending.values() if x is w)
                + (self.relay.publishers_on(w) if self.relay is not None else 0))

    def refusal(self, w: Worker) -> str | None:
        """Why `w` takes no new stream now, or None (runtime.placement.refusal)."""
        return refusal(w, self.streams_on(w), self.config.runtime.max_streams, stream_cost(self.workers))

    def swapper_of(self, body: dict[str, Any]) -> str:
        """The swapper a create request asks for (the API's default where it names none)."""
        swapper = body.get("swapper")
        return swapper if isinstance(swapper, str) else str(CreateBody.model_fields["swapper"].default)

    def choose(self, exclude: Worker | None = None, phase: float | None = None,
               swapper: str | None = None) -> Worker:
        """The worker a new stream goes to (runtime.placement.choose): PoolError 503 with every
        worker's reason when none takes it. `swapper`: the new stream's, whose cost the workers'
        reports may give."""
        try:
            return choose(self.workers, self.streams_on, self.config.runtime.max_streams,
                          phase=phase, exclude=exclude, swapper=swapper)
        except NoRoom as e:
            raise PoolError(503, "no worker can take another stream within its latency budget ("
                                 + str(e) + "): stop a stream, or start swapstream serve with more "
                                 "--workers or GPUs") from None

    # -- requests -------------------------------------------------------------------------------

    async def forward(self, w: Worker, method: str, path: str, body: bytes | None = None,
                      ctype: str | None = None, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        """One request to a worker's API; a worker that does not answer is a 503 for the client."""
        import aiohttp

        if w.session is None or w.state != "ready":
            raise PoolError(503, f"worker {w.name} is {w.state}; try again in a few seconds")
        headers = {"Content-Type": ctype} if ctype else {}
        try:
            async with w.session.request(method, f"{w.base}{path}", data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return r.status, dict(r.headers), await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise PoolError(503, f"worker {w.name} did not answer ({type(e).__name__}); "
                                 f"try again in a few seconds") from None

    async def create(self, raw: bytes, ctype: str) -> tuple[int, bytes]:
        """Place and create a stream; the worker's own answer (status, JSON body) goes back."""
        try:
            body = json.loads(raw) if ctype == "application/json" else None
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            # Not a stream definition: any worker gives the exact error.
            w = next((w for w in self.workers if w.state == "ready"), None)
            if w is None:
                raise PoolError(503, "no worker is running; try again in a few seconds")
            status, _, payload = await self.forward(w, "POST", "/api/streams", raw, ctype)
            return status, payload
        sid = body.get("id")
        if sid is None:
            sid = body["id"] = f"s-{secrets.token_hex(4)}"
        if isinstance(sid, str):
            async with self._lock:
                if sid in self.placed or sid in self._reserved:
                    raise PoolError(409, f"a stream with id {sid!r} already exists (it may have ended): "
                                         f"delete it first (DELETE /api/streams/{sid}) or choose another id")
                self._reserved.add(sid)
        try:
            grave = self._tombstones.get(sid) if isinstance(sid, str) else None
            if grave is not None and grave[1] > time.monotonic() and grave[0].state == "ready":
                # Deleted a moment ago and maybe still stopping there: the same worker answers
                # (409 while it stops), so two workers never hold one id (and one HLS folder).
                w = grave[0]
            else:
                w = self.choose(swapper=self.swapper_of(body))
            if isinstance(sid, str):
                self._pending[sid] = w
            status, _, payload = await self.forward(w, "POST", "/api/streams", json.dumps(body).encode(),
                                                    "application/json", timeout=60.0)
            if status == 201 and isinstance(sid, str):
                self.placed[sid] = Placed(sid, w, body, secrets.token_urlsafe(16))
        finally:
            if isinstance(sid, str):
                self._reserved.discard(sid)
                self._pending.pop(sid, None)
        return status, payload

    def owner(self, sid: str) -> Placed:
        p = self.placed.get(sid)
        if p is None and self.relay is not None:
            w = self.relay.stream_worker(sid)
            if w is not None:  # a WHIP publisher's stream: its worker answers for it
                return Placed(sid, w, {}, "")
        if p is None:
            raise PoolError(404, f"no stream with id {sid!r}: GET /api/streams lists them")
        if p.lost is not None:
            raise PoolError(503, f"stream {sid!r} is not running: {p.lost}")
        return p

    def forget(self, sid: str) -> None:
        p = self.placed.pop(sid, None)
        if p is not None:
            now = time.monotonic()
            self._tombstones = {k: v for k, v in self._tombstones.items() if v[1] > now}
            self._tombstones[sid] = (p.worker, now + TOMBSTONE_S)


def _error_text(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["error"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return payload[:200].decode(errors="replace")


# -- metrics from many workers --------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(\s+\S+)?$")


def label_text(labels: Mapping[str, str]) -> str:
    """`k="v",...` in Prometheus' text format, the values escaped as it requires."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{esc(str(v))}"' for k, v in labels.items())


def merge_metrics(texts: Sequence[tuple[str | Mapping[str, str], str]]) -> str:
    """One Prometheus text exposition from several workers' (name, text): every sample gets a
    `worker` label (or, for a name given as labels, those: a cluster's `node` and `worker`), and each
    metric family is written once with every worker's samples, as the format requires (a family's
    samples together, after its one HELP and TYPE)."""
    families: dict[str, dict[str, Any]] = {}
    for who, text in texts:
        prefix = label_text({"worker": who} if isinstance(who, str) else who)
        current: dict[str, Any] | None = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                kind, name = line[2:6], line.split(" ", 3)[2]
                current = families.setdefault(name, {"HELP": None, "TYPE": None, "samples": []})
                if current[kind] is None:
                    current[kind] = line
                continue
            m = _SAMPLE.match(line)
            if m is None or current is None:
                continue
            name, labels, value, ts = m.groups()
            label = prefix + (f",{labels}" if labels else "")
            current["samples"].append(f"{name}{{{label}}} {value}{ts or ''}")
    out = []
    for fam in families.values():
        out += [x for x in (fam["HELP"], fam["TYPE"]) if x is not None]
        out += fam["samples"]
    return "\n".join(out) + "\n"
