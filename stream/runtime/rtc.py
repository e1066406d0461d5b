"""WHIP publishers as runtime streams: each publisher's video is a `StreamPipeline` of the runtime
that also runs the API's streams, with the same stages, queues, batcher, degradation controller and
metrics; only its source and its sink are its own.

```
aiortc track ─► RtcSource ─► reader thread ─► analyse ─► swap (device batcher) ─► encode thread ─► RtcSink
 (WhipServer)   (bounded,     (GPU: NVDEC or                                       (label, mark;   (the outgoing
                 drops the     an upload)                                           GPU: NV12)       tracks, via
                 oldest)                                                                             WhipServer)
```

The server's half of a session (negotiation, tracks, the audio held back to meet the video) stays
in `live.webrtc.WhipServer`; `RuntimePublishers` is the `MediaFactory` it is given. On a GPU the
publisher's H.264 access units leave aiortc's decoder thread for the stream's NVDEC decoder
(`gpu.rtc.divert_video`); elsewhere aiortc decodes and the frames are converted in the stream's
reader thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import Config
from ..errors import SwapStreamError
from ..live.streams import VideoPacket
from ..live.webrtc import Deliver, PublisherLink
from ..types import Frame
from .stream import InputSpec, OutputSpec, StreamOptions, StreamPipeline, StreamSpec
from .whip_relay import WHIP_ID_PREFIX

if TYPE_CHECKING:
    from .manager import StreamRuntime

log = logging.getLogger(__name__)

RTP_VIDEO_TIME_BASE = Fraction(1, 90000)
"""RTP's video clock: the unit of aiortc's frame timestamps and of the diverted access units."""
FRAMES_WAITING = 2
"""Decoded frames that may wait for the reader thread; older ones are dropped (a live preview must
not lag), as the stream's own queues do."""
PACKETS_WAITING = 300
"""Access units that may wait for the NVDEC decoder: 10 s at 30 fps. Dropping one breaks the
frames after it until the next keyframe, so the bound is only there to keep memory bounded."""
RECEIVED_KEPT = 256
"""Receive times kept for frames on their way through the stream, by pts."""


class RtcSource:
    """A WHIP publisher's video as a stream's `Source`: `put` from the event loop (aiortc frames) or
    from aiortc's decoder thread (access units, `packets`); the stream's reader thread iterates.
    Each item's receive time is kept by its pts for `RtcSink`, which reports the delay."""

    info_fps = 30.0
    """For outputs that need a rate before any frame came: a browser's camera, usually."""
    audio_stream = None
    """The publisher's audio does not go through the stream: `WhipServer` sends it back itself."""
    time_base: Fraction | None = RTP_VIDEO_TIME_BASE

    def __init__(self, name: str) -> None:
        self.name = name
        self.packets = False
        """Hands over H.264 access units (diverted to NVDEC), not decoded frames. Set before the
        stream starts (`RuntimePublisher.prepare`)."""
        self.max_size: tuple[int, int] | None = None
        """With `packets`: the largest picture the first NVDEC decoder is made for (`GpuDecode`)."""
        self.decode_failed: Callable[[], None] | None = None
        """With `packets`: asks the publisher for a keyframe after an access unit failed to decode."""
        self._items: deque[tuple[Any, float]] = deque()
        self._cond = threading.Condition()
        self._received: OrderedDict[int, float] = OrderedDict()
        self._ended = False
        self._stopped = False
        self.dropped = 0
        """Items dropped here because the stream's reader fell behind."""
        self.frames = 0

    def put(self, item: Any) -> None:
        """A received video frame (`av.VideoFrame`) or an H.264 access unit (`VideoPacket`)."""
        now = time.monotonic()
        lost_access_unit = False
        with self._cond:
            if self._stopped or self._ended:
                return
            if len(self._items) >= (PACKETS_WAITING if isinstance(item, VideoPacket) else FRAMES_WAITING):
                old, _ = self._items.popleft()
                self.dropped += 1
                lost_access_unit = isinstance(old, VideoPacket)
            self._items.append((item, now))
            self._cond.notify()
        if lost_access_unit and self.decode_failed is not None:
            # The frames after a lost access unit do not decode properly: a keyframe mends them.
            self.decode_failed()

    def put_access_unit(self, data: bytes, timestamp: int) -> list[Any]:
        """`gpu.rtc.DecodeFn` for aiortc's decoder thread: the access unit goes to the stream's
        NVDEC decoder, and aiortc gets no frame to decode."""
        self.put(VideoPacket(data, timestamp, RTP_VIDEO_TIME_BASE, self.frames, keyframe=False))
        return []

    def open(self, *, wait_seconds: float = 0.0, on_wait: Callable[[], None] | None = None,
             stop: threading.Event | None = None) -> None:
        """Nothing to open or wait for: the connection is up before the stream starts."""

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._cond:
                while not self._items and not (self._ended or self._stopped):
                    self._cond.wait()
                if self._stopped or not self._items:
                    return
                item, received = self._items.popleft()
            yield self._item(item, received)

    def _item(self, item: Any, received: float) -> Any:
        pts = item.pts if item.pts is not None else self.frames
        self._received[pts] = received
        while len(self._received) > RECEIVED_KEPT:
            self._received.popitem(last=False)
        index = self.frames
        self.frames += 1
        if isinstance(item, VideoPacket):
            return item
        # In the reader thread: aiortc's decoded picture as the RGB the CPU stages (or the upload) take.
        rgb = np.ascontiguousarray(item.to_ndarray(format="rgb24"))
        return Frame(rgb, pts, item.time_base or RTP_VIDEO_TIME_BASE, index)

    def received(self, pts: int | None) -> float | None:
        """When the frame of `pts` was received (`time.monotonic()`); None if not known."""
        return self._received.pop(pts, None) if pts is not None else None

    def end(self) -> None:
        """The track ended: what is waiting is still handed over, then the iteration ends."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._items.clear()
            self._cond.notify_all()

    def close(self) -> None:
        self.stop()


class RtcSink:
    """The `webrtc` output of a WHIP publisher's stream: each finished picture (RGB on the CPU,
    NV12 from the GPU's compose) goes to `WhipServer`'s deliver, with the time it was received."""

    started = True
    """Nothing to start: the outgoing tracks exist already."""

    def __init__(self, deliver: Deliver, source: RtcSource) -> None:
        self._deliver = deliver
        self._source = source
        self.frames = 0

    def write(self, frame: Frame) -> None:
        self.write_nv12(frame.data, frame.pts, frame.time_base)

    def write_nv12(self, picture: np.ndarray, pts: int | None, time_base: Fraction | None) -> None:
        self._deliver(picture, pts, time_base, self._source.received(pts))
        self.frames += 1

    def write_audio(self, packet: Any) -> None:
        """The publisher's audio goes back through `WhipServer`, held to meet the video."""

    def close(self) -> None:
        """The tracks belong to the session, which closes them."""


class RuntimePublishers:
    """`WhipServer`'s `MediaFactory` for `swapstream serve`: each publisher a stream of `runtime`,
    swapped with the server's face (`image`, through the same face and consent checks as an API
    stream's), on serve's own settings (`config`, default the runtime's: `--config` and `--set`,
    read once when serve started) and its swapper."""

    def __init__(self, runtime: StreamRuntime, *, image: np.ndarray, image_name: str,
                 image_path: Path | None = None, config: Config | None = None) -> None:
        self.runtime = runtime
        self.image = image
        self.image_name = image_name
        self.image_path = image_path
        self.config = config or runtime.config
        gpus = [s for s in runtime.slots if s.gpu_index is not None]
        self.gpu = gpus[0] if gpus else None
        """Its NVDEC answer is asked for when the runtime warms up (`DeviceSlot.warm`), so that the
        first publisher's `prepare`, on the event loop, finds it kept."""

    def __call__(self, link: PublisherLink) -> RuntimePublisher:
        return RuntimePublisher(self, link)


class RuntimePublisher:
    """One publisher's stream (`live.webrtc.PublisherMedia`)."""

    def __init__(self, owner: RuntimePublishers, link: PublisherLink) -> None:
        self.owner = owner
        self.link = link
        self.id = WHIP_ID_PREFIX + link.sid[:12]
        self.source = RtcSource(self.id)
        self.pipeline: StreamPipeline | None = None
        self._closed = False
        self._watch: asyncio.Task[None] | None = None

    def prepare(self, pc: Any) -> None:
        """On a GPU: H.264 first in the answer, and its access units to the stream's NVDEC decoder
        where the GPU has one (else aiortc decodes, and the frames are uploaded)."""
        gpu = self.owner.gpu
        if gpu is None:
            return
        from ..gpu.rtc import RTC_MAX_SIZE, divert_video, keyframe_request, prefer_h264

        transceiver = prefer_h264(pc)
        nvdec, why = gpu.nvdec_available()
        if not nvdec:
            log.info("WHIP publisher %s: decoded on the CPU and uploaded (%s)", self.id, why)
            return
        if divert_video(transceiver.receiver, self.source.put_access_unit, asyncio.get_running_loop()):
            self.source.packets = True
            self.source.max_size = RTC_MAX_SIZE
            self.source.decode_failed = keyframe_request(transceiver.receiver)

    async def start(self) -> None:
        o = self.owner
        spec = StreamSpec(self.id, InputSpec(f"webrtc://{self.id}"), (OutputSpec("webrtc"),),
                          swapper=o.config.swapper)
        pipeline = await o.runtime.add_stream(spec, StreamOptions(config=o.config, source=self.source,
                                                                  sink=RtcSink(self.link.deliver, self.source)))
        self.pipeline = pipeline
        try:
            await pipeline.set_source(o.image, o.image_name, o.image_path)
        except BaseException:
            if self._closed:
                await self._remove()  # closed meanwhile: close() found no stream to remove yet
            else:
                await self.close()
            raise
        if self._closed:  # the session went while the stream started
            await self._remove()
            return
        self._watch = asyncio.ensure_future(self._watch_end(pipeline))

    async def _watch_end(self, pipeline: StreamPipeline) -> None:
        """A stream that ends by itself (it failed, or was removed through the API) ends the session."""
        await pipeline.done.wait()
        if not self._closed:
            log.info("WHIP publisher %s: its stream %s (%s)", self.id, pipeline.state, pipeline.error or "no error")
            self.link.ended()

    def push(self, frame: Any) -> None:
        self.source.put(frame)

    def end(self) -> None:
        self.source.end()

    @property
    def faces(self) -> int:
        return self.pipeline.faces_swapped if self.pipeline is not None else 0

    @property
    def dropped(self) -> int:
        """Frames dropped before the reader took them, and in the stream's queues."""
        p = self.pipeline
        queues = p.in_q.dropped + p.swap_q.dropped + p.enc_q.dropped if p is not None else 0
        return self.source.dropped + queues

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.source.stop()
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        await self._remove()

    async def _remove(self) -> None:
        from .manager import StreamNotFound

        if self.pipeline is None:
            return
        try:
            await self.owner.runtime.remove_stream(self.id, wait=5.0)
        except StreamNotFound:
            pass  # removed already (through the API), or the runtime has closed
        except SwapStreamError as e:
            log.warning("WHIP publisher %s: stopping its stream: %s", self.id, e)
