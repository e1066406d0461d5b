"""Many live streams in one process: the asyncio runtime, dynamic batching across streams, a latency
budget per stream, a degradation controller, Prometheus metrics and a REST control API.

See docs/runtime.md. Nothing heavy is imported here: `swapstream.runtime.queues`, `.batcher` and
`.controller` are pure asyncio/logic modules that the tests use on their own.
"""
