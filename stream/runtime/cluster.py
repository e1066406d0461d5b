"""`swapstream serve --ray ADDRESS|auto`: the worker pool across machines, on a Ray cluster.

```
swapstream serve --ray HOST:6379 (Ray driver: control plane)          Ray nodes
 ├─ control API, /metrics (node + worker labels), /hls  ──►  node A: w0 actor (0.25 GPU): StreamRuntime, API on A:port
 ├─ WorkerPool: placement by load reports (runtime.placement)   w1 actor (0.25 GPU) ...
 └─ failover: a dead actor's streams to the other workers ──►  node B: w2 actor ...
```

This is `runtime.workers.WorkerPool` with another launcher: each worker is a Ray actor instead of a
local process. Everything else is the pool's own: placement (`runtime.placement`, by each worker's
`/worker/load`), forwarding every request about a stream to its worker, the merged /metrics, and
failover (a dead worker's streams created again on the others with their source face: RTMP inputs
pulled again, outputs reconnecting to the same URLs). Ray does what it is good at: it places the
actors on nodes with the resources they ask for (a fraction of a GPU, so several workers share one
GPU under the node's MPS daemon, or a custom resource standing for GPU slots on CPU-only nodes), spread
over the nodes, and restarts an actor whose process or node died (`max_restarts=-1`), on another node
when its own is gone.

An actor runs the worker's app (`runtime.worker.build_app`) in a thread of its own and serves it over
TCP on its node's address, with a random bearer token of its own that the driver passes when it
creates it. The driver watches each actor through a call that returns only when the actor stops
(`wait_stopped`): Ray fails that call the moment it knows the actor or its node died.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import ConfigError
from .workers import START_TIMEOUT_S, PoolError, Worker, WorkerPool

log = logging.getLogger(__name__)

RAY_VERSION = "2.60.0"
"""The Ray release `swapstream[cluster]` pins; the driver and every node must run the same one."""
CONNECT_TIMEOUT_S = 3.0
"""How long the driver waits for the Ray head's port to answer before saying it does not."""
RESTART_POLL_S = 0.2
"""How often the driver asks a restarting actor whether it is up again."""


def connect_ray(address: str) -> None:
    """Join the Ray cluster at `address` ("auto": the one this machine is part of) as its driver, or
    raise ConfigError with one line that names the address and the fix."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: pip install 'swapstream[cluster]' "
                          f"(ray=={RAY_VERSION}), the same version as the cluster's") from None
    if ray.is_initialized():
        return
    if address != "auto":
        host, sep, port = address.rpartition(":")
        host = host.removeprefix("ray://").strip("[]")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"--ray {address!r} is not an address: give HOST:PORT of the cluster's head "
                              f"(e.g. 10.0.0.5:6379), or auto on a node of a running cluster")
        try:
            # Ray's own client retries for a long time: a head that is not there is said at once.
            with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as e:
            why = e.strerror or type(e).__name__
            raise ConfigError(f"--ray {address}: nothing answers there ({why}). Start the cluster's head "
                              f"with `ray start --head --port={port}` on {host}, or give the address "
                              f"that `ray status` shows") from None
    try:
        ray.init(address=address, namespace="swapstream", log_to_driver=True, logging_level=logging.WARNING)
    except ConnectionError as e:
        raise ConfigError(f"--ray {address}: no running Ray cluster found ({str(e).splitlines()[0]}). Start "
                          f"one with `ray start --head`, or give its head's HOST:PORT") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "version mismatch" in str(e).lower():
            raise ConfigError(f"--ray {address}: the cluster runs another Ray or Python version than this "
                              f"server ({first}). Install ray=={RAY_VERSION} (swapstream[cluster]) and "
                              f"the same Python on every node and here") from None
        raise ConfigError(f"--ray {address}: joining the cluster failed ({first})") from None


class WorkerActor:
    """One worker as a Ray actor: the worker's app (runtime.worker.build_app) served over TCP on the
    actor's node, in a thread with its own event loop (Ray calls the actor's methods on other
    threads: `max_concurrency` lets `wait_stopped` block beside `info` and `stop`)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._loop = asyncio.new_event_loop()
        self._up = threading.Event()
        self._down = threading.Event()
        self._error: str | None = None
        self._info: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(settings,), name="swapstream-worker", daemon=True)
        self._thread.start()
        self._up.wait()
        if self._error is not None:
            # Ray reports the actor's creation as failed, with this message, to the driver.
            raise RuntimeError(self._error)

    def _run(self, settings: dict[str, Any]) -> None:
        import ray
        from aiohttp import web

        from ..redact import install_log_redaction
        from .worker import build_app

        install_log_redaction()  # this process's log lines, the libraries' too, without keys or tokens
        asyncio.set_event_loop(self._loop)
        try:
            ctx = ray.get_runtime_context()
            gpus = ray.get_gpu_ids()
            if settings["device"].startswith("cuda"):
                # Ray made the actor's GPU the only one visible: CUDA's 0, NVML's the host's number.
                settings = settings | {"device": "cuda:0",
                                       "nvml_index": int(gpus[0]) if gpus and str(gpus[0]).isdigit() else None}
            app, _runtime = build_app(settings)
            runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(runner.setup())
            host = ray.util.get_node_ip_address()
            site = web.TCPSite(runner, host, 0)
            self._loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._info = {"address": f"http://{host}:{port}", "node": ctx.get_node_id(), "node_ip": host,
                          "pid": os.getpid()}
        except BaseException as e:  # the driver gets it as the creation's error
            self._error = f"worker {settings.get('name')} could not start: {type(e).__name__}: {e}"
            self._up.set()
            return
        self._up.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())  # stops the streams
            self._down.set()

    def info(self) -> dict[str, Any]:
        return self._info

    def wait_stopped(self) -> None:
        """Returns when the worker stopped; fails (on the driver's side) when the actor dies."""
        self._down.wait()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._down.wait(20.0)


class RayWorkerPool(WorkerPool):
    """`WorkerPool` whose workers are Ray actors spread over the cluster's nodes (see the module)."""

    def __init__(self, config: Config, *, workers: int, gpus: float = 0.25,
                 resource: tuple[str, float] | None = None, cpus: float = 1.0,
                 hls_root: Path | None = None, media_root: Path | None = None,
                 default_source: Path | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        on_gpu = resource is None and gpus > 0
        super().__init__(config, devices=["cuda:0" if on_gpu else "cpu"], per_device=workers,
                         hls_root=hls_root, media_root=media_root, default_source=default_source)
        self.gpus = gpus if on_gpu else 0.0
        self.resource = resource
        self.cpus = cpus
        self._id = secrets.token_hex(3)

    def _asks(self) -> tuple[str, float]:
        return self.resource if self.resource is not None else ("GPU", self.gpus)

    async def _prepare(self) -> None:
        import ray

        name, amount = self._asks()
        total = await asyncio.get_running_loop().run_in_executor(None, ray.cluster_resources)
        have = float(total.get(name, 0.0))
        if have < amount:
            kinds = ", ".join(sorted(k for k in total if not k.startswith("node:"))) or "none"
            how = ("--num-gpus N" if name == "GPU" else f"--resources '{{\"{name}\": N}}'")
            raise PoolError(503, f"the Ray cluster has {have:g} {name} and each worker asks for {amount:g}: "
                                 f"start its nodes with `ray start ... {how}` (it has: {kinds})"
                                 + (", or use --ray-resource NAME=AMOUNT on CPU-only nodes" if name == "GPU" else ""))
        if have < amount * len(self.workers):
            log.warning("the Ray cluster has %g %s: %d of the %d workers fit until nodes join", have, name,
                        int(have // amount), len(self.workers))

    def _settings(self, w: Worker) -> dict[str, Any]:
        return {"name": w.name, "device": w.device, "nvml_index": None, "token": w.token,
                "config": self.config.model_dump(mode="json"),
                "hls_root": str(self.hls_root) if self.hls_root else None,
                "media_root": str(self.media_root) if self.media_root else None,
                "default_source": str(self.default_source.resolve()) if self.default_source else None}

    async def _launch(self, w: Worker) -> None:
        import aiohttp
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if w.handle is None:
            w.token = secrets.token_urlsafe(24)
            name, amount = self._asks()
            actor = ray.remote(WorkerActor).options(
                name=f"swapstream-{self._id}-{w.name}", max_restarts=-1, max_task_retries=0,
                max_concurrency=4, num_cpus=self.cpus, num_gpus=self.gpus,
                resources={name: amount} if self.resource is not None else None,
                # One node's loss should take as few workers as it can: spread them.
                scheduling_strategy="SPREAD")
            w.handle = actor.remote(self._settings(w))
        # A first start has a deadline; a restart waits as long as it takes Ray to find room for it
        # (a node that joins), while the pool serves with the workers it has.
        deadline = time.monotonic() + START_TIMEOUT_S if w.crashes == 0 else None
        while True:
            try:
                info = await asyncio.wait_for(asyncio.wrap_future(w.handle.info.remote().future()),
                                              None if deadline is None else max(0.0, deadline - time.monotonic()))
                break
            except ActorUnavailableError:  # restarting: ask again
                await asyncio.sleep(RESTART_POLL_S)
            except asyncio.TimeoutError:
                name, amount = self._asks()
                raise PoolError(503, f"worker {w.name}: Ray did not start its actor in {START_TIMEOUT_S:.0f} s "
                                     f"(it asks for {amount:g} {name} and {self.cpus:g} CPU; see `ray status`)") from None
            except RayActorError as e:
                raise PoolError(503, f"worker {w.name}: its Ray actor could not start: "
                                     f"{str(e).strip().splitlines()[-1][:300]}") from None
            if self.closing:
                raise PoolError(503, "the server is stopping")
        w.node, w.node_ip, w.base = info["node"], info["node_ip"], info["address"]
        w.proc_pid = info["pid"]
        w.death = asyncio.wrap_future(w.handle.wait_stopped.remote().future())
        if w.session is not None:
            await w.session.close()
        w.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {w.token}"})

    def _exited(self, w: Worker) -> bool:
        if w.death is None or not w.death.done():
            return False
        if not w.death.cancelled() and w.death.exception() is not None:  # retrieved: no asyncio warning
            log.warning("worker %s on node %s: %s", w.name, w.node,
                        str(w.death.exception()).strip().splitlines()[0][:300])
        return True

    async def _crashed(self, w: Worker) -> None:
        # Ray reports the actors of a lost node one by one, seconds apart. The node's other workers
        # are asked first (a closed port answers in a millisecond, a silent host in 1 s): those that
        # do not answer are failed over together with `w`, and no stream of `w` is moved onto them.
        same = [x for x in self.workers if x is not w and x.node == w.node and x.state == "ready"]

        async def answers(x: Worker) -> bool:
            try:
                await self.forward(x, "GET", "/worker/load", timeout=1.0)
                return True
            except PoolError:
                return False

        alive = await asyncio.gather(*(answers(x) for x in same))
        gone = [x for x, ok in zip(same, alive) if not ok and x.state == "ready"]
        for x in gone:
            log.warning("worker %s on node %s does not answer either: taken as dead", x.name, x.node)
            x.state = "dead"  # before any move: no stream is placed on it
        await asyncio.gather(*(WorkerPool._crashed(self, x) for x in [w, *gone]))

    def _restart_delay(self, w: Worker) -> float:
        return 0.0  # Ray restarts the actor itself (with its own backoff); we wait for it in _launch

    async def _stop(self, w: Worker) -> None:
        import ray

        if w.handle is None:
            return
        if w.state == "ready":  # one being restarted (or waiting for room) has nothing to stop
            try:
                await asyncio.wait_for(asyncio.wrap_future(w.handle.stop.remote().future()), 25.0)
            except Exception as e:  # stopping: a dead or stuck actor is killed below all the same
                log.debug("worker %s did not stop cleanly: %s", w.name, e)
        ray.kill(w.handle, no_restart=True)
        w.handle = None
