"""Fixtures for the runtime tests: a stamped clip, the runtime and its API served on loopback.

Importable without PyAV, aiohttp, aiortc or prometheus_client (absent on the GPU machine, whose run is
`-m gpu` only): the batcher and controller tests need none of them. Each test module that does
skips itself without them; the fixtures import them when used.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from swapstream.config import Config, load_config
from swapstream.demo import grace_hopper, render_target_frame

from ..helpers.stamps import stamp

if TYPE_CHECKING:
    from swapstream.runtime.api import ApiSettings
    from swapstream.runtime.manager import StreamRuntime

FPS = 10
SIZE = (320, 240)
CELL = 12
TOKEN = "test-token-0123456789abcdef"


def make_clip(path: Path, seconds: float, size: tuple[int, int] = SIZE, fps: int = FPS) -> list[np.ndarray]:
    """An H.264 clip of the moving Grace Hopper portrait, each frame's number stamped in a corner."""
    av = pytest.importorskip("av")
    frames = []
    portrait = grace_hopper()
    with av.open(str(path), "w") as c:
        v = c.add_stream("libx264", rate=fps)
        v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
        v.options = {"g": str(fps), "bf": "0", "crf": "18", "preset": "ultrafast"}
        for i in range(int(seconds * fps)):
            img = render_target_frame(portrait, i / fps, size)
            stamp(img, i, CELL)
            frames.append(img)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, fps)
            c.mux(v.encode(f))
        c.mux(v.encode(None))
    return frames


@pytest.fixture(scope="session")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    folder = tmp_path_factory.mktemp("media")
    path = folder / "clip.mp4"
    return path, make_clip(path, 4.0)


@dataclass
class Served:
    """A runtime with its API on an ephemeral loopback port, in its own loop and thread."""

    url: str
    runtime: StreamRuntime
    loop: asyncio.AbstractEventLoop
    settings: ApiSettings

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine in the server's loop (to reach the runtime directly)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def headers(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def serve_runtime(runtime: StreamRuntime, settings: ApiSettings) -> Iterator[Served]:
    from aiohttp import web

    from swapstream.runtime.api import mount_runtime

    loop = asyncio.new_event_loop()
    app = web.Application()
    mount_runtime(app, runtime, settings)
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())  # stops the runtime (on_cleanup)
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(20), "the API server did not start"
    try:
        yield Served(f"http://127.0.0.1:{holder['port']}", runtime, loop, settings)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def runtime_config(*overrides: str) -> Config:
    return load_config("multi_stream", list(overrides))


@pytest.fixture
def served(clip: tuple[Path, list[np.ndarray]], tmp_path: Path) -> Iterator[Served]:
    from swapstream.runtime.api import ApiSettings
    from swapstream.runtime.manager import StreamRuntime

    runtime = StreamRuntime(runtime_config(), devices=["cpu"])
    settings = ApiSettings(TOKEN, hls_root=tmp_path / "hls", media_root=clip[0].parent)
    yield from serve_runtime(runtime, settings)
