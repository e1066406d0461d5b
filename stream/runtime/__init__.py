"""Many live streams in one server: the asyncio runtime, dynamic batching across streams, a latency
budget per stream, a degradation controller, Prometheus metrics and a REST control API, in one
process or in N worker processes per GPU behind one server.

- `manager`: `StreamRuntime` and its `DeviceSlot`s (one device thread, batchers, swap backends each);
- `stream`: one stream's stages (reader, analysis, swap, encode); `gpu_stages`: their GPU versions;
- `swappers`: the swap backends as the runtime calls them (mesh, neural), shared by a device's streams;
- `batcher`, `controller`, `priority`, `metrics`;
- `api` (routes, dashboard in `static/`); `workers`, `worker`, `pool_api`: `serve --workers N`.

See docs/runtime.md. Nothing heavy is imported here: `swapstream.runtime.batcher` and `.controller`
are pure asyncio/logic modules that the tests use on their own (as is `swapstream.queues`, the
drop-oldest queue between a stream's stages, shared with `swapstream.live`). The runtime uses `live`
(readers, writers, WebRTC); `live` never imports the runtime.
"""
