"""`Timeline`: one clock for a live input's video and audio, through reconnects and timestamp jumps.

Pure logic: packets are (kind, seconds). Each case feeds what a real input sends in that fault, in
the order it arrives, and checks that the output keeps the source's A/V relation exactly and that
the video runs on one frame at a time.
"""

from __future__ import annotations

from fractions import Fraction

from swapstream.live.streams import Timeline

V = Fraction(1, 10)
"""One video frame at 10 fps."""
A = Fraction(1024, 48000)
"""One AAC packet at 48 kHz."""


class Feed:
    """Feeds a Timeline as `LiveReader` does: audio that must wait is offered again, in order, after
    every packet, until it is placed."""

    def __init__(self) -> None:
        self.tl = Timeline()
        self.held: list[Fraction] = []
        self.video: list[tuple[Fraction, Fraction]] = []
        """(source time, output time) of each video packet."""
        self.audio: list[tuple[Fraction, Fraction]] = []

    def packets(self, source_start: Fraction, raw_start: Fraction, seconds: Fraction,
                audio_first: bool = False) -> None:
        """`seconds` of interleaved video and audio whose source clock starts at `source_start` and
        whose timestamps start at `raw_start` (the publisher's), in arrival order."""
        items: list[tuple[Fraction, str]] = []
        t = Fraction(0)
        while t < seconds:
            items.append((t, "video"))
            t += V
        t = Fraction(0)
        while t < seconds:
            items.append((t - (A / 2 if audio_first else 0), "audio"))
            t += A
        for t, kind in sorted(items, key=lambda x: (x[0], x[1] != ("audio" if audio_first else "video"))):
            raw = raw_start + t
            if kind == "video":
                self.video_packet(source_start + t, raw)
            else:
                self.held.append((source_start + t, raw))  # type: ignore[arg-type]
            self._flush()

    def video_packet(self, source: Fraction, raw: Fraction) -> None:
        """One video packet at raw time `raw` (source time `source`), placed as the reader does."""
        off = self.tl.offset("video", raw, raw, V)
        assert off is not None
        self.video.append((source, raw + off))

    def _flush(self) -> None:
        while self.held:
            src, raw = self.held[0]  # type: ignore[misc]
            off = self.tl.offset("audio", raw, raw, A)
            if off is None:
                return
            self.held.pop(0)
            self.audio.append((src, raw + off))

    def skews(self) -> set[Fraction]:
        """Output minus source time, per stream: one value each when A and V share one clock."""
        return {o - s for s, o in self.video}, {o - s for s, o in self.audio}


def assert_one_clock(f: Feed, epochs: list[tuple[Fraction, Fraction]]) -> None:
    """Within each epoch (source-time range), audio and video have the same output offset."""
    for lo, hi in epochs:
        v = {o - s for s, o in f.video if lo <= s < hi}
        a = {o - s for s, o in f.audio if lo <= s < hi}
        assert len(v) == 1 and v == a, (lo, hi, v, a)


def assert_video_runs_on(f: Feed) -> None:
    out = [o for _, o in f.video]
    assert all(b - a == V for a, b in zip(out, out[1:])), [float(b - a) for a, b in zip(out, out[1:]) if b - a != V]


def test_first_connection_keeps_its_times() -> None:
    f = Feed()
    f.packets(Fraction(0), Fraction(5), Fraction(3))
    assert {o - s for s, o in f.video} == {Fraction(5)} == {o - s for s, o in f.audio}


def test_a_reconnect_continues_the_video_and_moves_the_audio_with_it() -> None:
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(4))
    f.tl.new_connection()
    # 3 s later, a new publisher whose clock starts at 0 again, and whose audio comes first.
    f.packets(Fraction(7), Fraction(0), Fraction(4), audio_first=True)
    assert_one_clock(f, [(Fraction(0), Fraction(4)), (Fraction(7), Fraction(11))])
    assert_video_runs_on(f)
    assert not f.held


def test_a_publisher_restarted_behind_the_same_connection() -> None:
    # nginx keeps the player connected while one publisher goes and the next comes: no new
    # connection, just timestamps that go back to 0, audio first.
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(13))
    f.packets(Fraction(14), Fraction(0), Fraction(5), audio_first=True)
    assert_one_clock(f, [(Fraction(0), Fraction(13)), (Fraction(14), Fraction(19))])
    assert_video_runs_on(f)
    assert f.tl.jumps == 2  # once per stream


def test_a_forward_jump_within_a_connection() -> None:
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(3))
    f.packets(Fraction(3), Fraction(103), Fraction(3))  # the encoder's clock jumps by 100 s
    assert_one_clock(f, [(Fraction(0), Fraction(6))])
    assert_video_runs_on(f)


def test_an_audio_only_jump_does_not_hold_the_audio_for_ever() -> None:
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(2))
    # The audio's timestamps alone jump by 50 s; the video's go on.
    for k in range(40):
        t = Fraction(2) + k * V
        f.video_packet(t, t)
        for j in range(5):
            ta = t + j * A
            if ta < t + V:
                f.held.append((ta, ta + 50))  # type: ignore[arg-type]
        f._flush()
    assert not f.held  # placed once the video ran on 1 s without a jump of its own
    out = [o for _, o in f.audio]
    assert all(b > a for a, b in zip(out, out[1:]))
    assert max(b - a for a, b in zip(out, out[1:])) < Fraction(1, 10)  # it continued, no 50 s hole


def test_a_connection_that_dropped_before_its_video_leaves_no_wait_behind() -> None:
    # A reconnect whose connection drops again before its first video frame: its audio waited for
    # that video, and went with the connection (the reader's held audio is per connection). The next
    # connection starts afresh, even when its video comes first. (Without that, its audio waited 1 s
    # for a video jump that had already happened, then continued after its own end, seconds off.)
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(9))
    f.tl.new_connection()
    for k in range(10):
        f.held.append((Fraction(11) + k * A, k * A))  # type: ignore[arg-type]
        f._flush()
    assert len(f.held) == 10  # all waiting for a video that never came
    f.held.clear()
    f.tl.new_connection()
    f.packets(Fraction(14), Fraction(3), Fraction(5))
    assert_one_clock(f, [(Fraction(0), Fraction(9)), (Fraction(14), Fraction(19))])
    assert_video_runs_on(f)
    assert not f.held


def test_a_connection_that_dropped_before_its_audio_leaves_no_epoch_for_the_next_audio() -> None:
    # The mirror case: a connection brings video only, then drops; the next one's audio comes
    # first. That audio belongs to the new connection's video, not to the epoch the last one opened.
    f = Feed()
    f.packets(Fraction(0), Fraction(0), Fraction(9))
    f.tl.new_connection()
    for k in range(5):
        f.video_packet(Fraction(11) + k * V, k * V)
    f.tl.new_connection()
    f.packets(Fraction(14), Fraction(3), Fraction(5), audio_first=True)
    assert_one_clock(f, [(Fraction(0), Fraction(9)), (Fraction(14), Fraction(19))])
    assert_video_runs_on(f)
    assert not f.held
