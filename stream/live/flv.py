"""An RTMP output whose packets leave as soon as they are muxed.

FFmpeg's muxers interleave: `av_interleaved_write_frame`, the only write PyAV 18 offers (PyAV issue
#1275), holds a video packet until every other stream has a packet with a later time. A live job's
output audio is the input's, and in an input its publisher interleaved (OBS does), the audio that
follows a frame arrives with the next frame: every swapped frame waited one frame interval (33 ms
at 30 fps) in the muxer. Measured through nginx-rtmp on two cores at 640x360 15 fps: the round trip
was 73 ms with the output's audio and 28.5 ms without it.

`SplicedFlv` has the part of PyAV's output container that `LiveWriter` uses (`add_stream`,
`add_stream_from_template`, `metadata`, `mux`, `close`). Each stream gets an FLV muxer of its own,
writing into memory: with one stream, the interleaving has nothing to wait for. The tags they write
are spliced, in the order they were muxed, into one FLV byte stream, which goes to the server
through FFmpeg's RTMP protocol (it takes FLV bytes, as FFmpeg's own FLV muxer writes them) by way of
the raw `data` muxer. The tags are FFmpeg's: its AVC and AAC sequence headers, keyframe flags,
composition times and timestamps (each muxer writes a packet's dts in milliseconds, so the streams
keep one timeline). Of the audio muxer's output, its FLV header and its onMetaData are left out: the
stream has one header, and its metadata (with the disclosure tags) is the video muxer's.
"""

from __future__ import annotations

import io
from typing import Any

import av

FLV_HEADER = b"FLV\x01\x05\x00\x00\x00\x09" + b"\x00\x00\x00\x00"
"""The stream's header: version 1, audio and video present, 9 bytes long, then PreviousTagSize0."""
HEADER_BYTES = len(FLV_HEADER)
TAG_HEADER_BYTES = 11
"""A tag: type (1 byte), data size (3), timestamp (3 + 1 extended), stream id (3); then its data and
a 4-byte PreviousTagSize."""
SCRIPT_TAG = 18
"""onMetaData."""


def _tags(data: bytes | bytearray) -> list[tuple[int, bytes]]:
    """The complete tags at the start of `data`, each with its PreviousTagSize: (type, bytes)."""
    tags, pos = [], 0
    while len(data) - pos >= TAG_HEADER_BYTES:
        end = pos + TAG_HEADER_BYTES + int.from_bytes(data[pos + 1:pos + 4], "big") + 4
        if end > len(data):
            break
        tags.append((data[pos], bytes(data[pos:end])))
        pos = end
    return tags


class _Memory(io.RawIOBase):
    """Where one stream's FLV muxer writes: kept until its complete tags are taken."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += b
        return len(b)


class _Part:
    """One stream's FLV muxer and what it wrote that is not spliced yet."""

    def __init__(self) -> None:
        self.memory = _Memory()
        self.container = av.open(self.memory, "w", format="flv")
        self.header_seen = False

    def take_tags(self) -> list[tuple[int, bytes]]:
        """The complete tags written so far, each with its PreviousTagSize: (type, bytes)."""
        data = self.memory.data
        pos = 0
        if not self.header_seen:
            if len(data) < HEADER_BYTES:
                return []
            pos, self.header_seen = HEADER_BYTES, True
        tags = _tags(data[pos:])
        del data[:pos + sum(len(b) for _t, b in tags)]
        return tags


class SplicedFlv:
    """An FLV stream to an RTMP URL with no interleaving delay (module doc)."""

    def __init__(self, url: str, *, timeout: float, options: dict[str, str] | None = None) -> None:
        self._out = av.open(url, "w", format="data", timeout=timeout, options=options or {})
        self._data = self._out.add_data_stream()
        self._parts: dict[str, _Part] = {}
        self._started = False
        self._waiting: list[bytes] = []  # audio tags written before the video's header went

    @property
    def metadata(self) -> dict[str, str]:
        """The stream's onMetaData (the video muxer's; its video stream must exist)."""
        return self._parts["video"].container.metadata

    def add_stream(self, codec_name: str, rate: Any = None) -> Any:
        """A stream encoded here: video (`LiveWriter`'s), or audio (a publisher's, in the tools)."""
        kind = av.codec.Codec(codec_name, "w").type
        return self._part(kind).container.add_stream(codec_name, rate=rate)

    def add_stream_from_template(self, template: Any) -> Any:
        """The audio stream, copied from the input's."""
        return self._part("audio").container.add_stream_from_template(template)

    def _part(self, kind: str) -> _Part:
        if kind in self._parts:
            raise ValueError(f"this FLV output has a {kind} stream already")
        part = self._parts[kind] = _Part()
        return part

    def mux(self, packets: Any) -> None:
        for p in [packets] if isinstance(packets, av.Packet) else packets:
            kind = p.stream.type
            part = self._parts.get(kind)
            if part is None:
                raise ValueError(f"this FLV output has no {kind} stream")
            part.container.mux(p)
            self._splice(kind, part.take_tags())

    def _splice(self, kind: str, tags: list[tuple[int, bytes]]) -> None:
        chunks = [b for t, b in tags if kind == "video" or t != SCRIPT_TAG]
        if not self._started:
            if kind != "video" or not chunks:
                self._waiting += chunks  # the stream starts with the video's header and metadata
                return
            self._started = True
            for other, part in self._parts.items():
                if other != "video":
                    # Its header now (its sequence header: nginx-rtmp gives it to each new player
                    # first), not with its first packet: a player that joins at once and probes
                    # for a second must find the audio in it, as with one muxer.
                    part.container.start_encoding()
                    self._waiting = [b for t, b in part.take_tags() if t != SCRIPT_TAG] + self._waiting
            meta = self._metadata_tag()
            media = [b for t, b in tags if t != SCRIPT_TAG]
            chunks = [FLV_HEADER, *([meta] if meta else chunks[:1]), *self._waiting, *media]
            self._waiting = []
        if chunks:
            packet = av.Packet(b"".join(chunks))
            packet.stream = self._data  # the raw data muxer writes it as it is
            self._out.mux(packet)

    def _metadata_tag(self) -> bytes | None:
        """An onMetaData for every stream: what FFmpeg's FLV muxer writes for a container of them
        all (the video muxer's names only the video, and a player that probes briefly, as ours
        do, then finds no audio). None where it cannot be made."""
        memory = _Memory()
        try:
            c = av.open(memory, "w", format="flv")
            for part in self._parts.values():
                c.add_stream_from_template(part.container.streams[0])
            c.metadata.update(self.metadata)
            c.start_encoding()  # the header: FLV header, onMetaData, the sequence headers
        except (av.error.FFmpegError, ValueError):
            return None
        script = next((b for t, b in _tags(memory.data[HEADER_BYTES:]) if t == SCRIPT_TAG), None)
        return script

    def close(self) -> None:
        """Each muxer's trailer (the AVC end of sequence) goes out, then the connection closes."""
        try:
            for kind, part in self._parts.items():
                part.container.close()
                if self._started:
                    self._splice(kind, part.take_tags())
        finally:
            self._out.close()
