"""The degradation controller: steps a stream down when it misses its latency budget or the GPU stays
saturated, and back up when load falls, with hysteresis. Pure logic: it sees observations and a clock
and returns decisions; the runtime applies them, logs them and exports them as metrics.

The ladder, cheapest loss of quality first. The neural face stack's extra networks go before anything
that touches the swap itself or its cadence, because they are where a zoo stream's frame budget goes
and the swap without them is still the swap:

0a. `enhancer_off`: stop running the face enhancer (only on the ladder of a stream that has one);
0b. `region_off`: stop running the region parser (only where `region` is in mask.types);
1. `detect_less`: run the face detector less often (landmarks keep tracking in between);
2. `mesh`: move the stream from its neural swapper to the built-in `mesh` swapper (skipped when the
   stream already uses `mesh`);
3. `low_res`: swap the faces at a lower resolution and scale the change back up (host frames only:
   not on the ladder of a stream on a GPU, whose frames are swapped on the device).

Hysteresis: a step down needs the p99 over the frames since the last change to exceed the budget
(at least `min_samples` of them, so that one slow frame after a change cannot trigger it) and
`down_cooldown` seconds since the last change; a step up needs the p99 under `up_ratio` x budget and the
GPU under `gpu_low`, continuously for `up_hold` seconds. The gap between `up_ratio` and 1 is what keeps
a stream whose cost sits near its budget from flapping.

A step down that makes things worse is undone: when the first p99 over enough frames after it is
over the budget and more than `worse_ratio` times what it was before it, the stream goes back up
and that step is not taken again for `futile_hold` seconds. The ladder is one sequence, so while a
step is blocked the steps after it are too: the stream stays where it is, over its budget, which
its worker's load report shows to placement. (On an H200 under load the `mesh` step cost more than the neural swap it
replaced, and streams stepped down into a state they could not leave.) Saturation of the GPU steps
down only a stream that is not comfortably within its budget: a GPU full of streams within budget
is the goal, not a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENHANCER_OFF = "enhancer_off"
REGION_OFF = "region_off"
DETECT_LESS = "detect_less"
MESH = "mesh"
LOW_RES = "low_res"


def ladder(swapper: str, low_res: bool = True, *, enhancer: bool = False,
           region: bool = False, mesh: bool = True) -> tuple[str, ...]:
    """The steps available to a stream whose configured swapper is `swapper`, in order. `low_res`
    False leaves that step out (a GPU device, where it would change nothing); `mesh` False leaves
    out the fall-back to the mesh swapper (a GPU device, where it costs more than it saves);
    `enhancer` and `region` say whether the stream runs a face enhancer and a region parser (zoo
    swappers only: the mesh swapper runs neither), whose steps then come first."""
    neural = swapper != "mesh"
    stack = (((ENHANCER_OFF,) if enhancer and neural else ()) +
             ((REGION_OFF,) if region and neural else ()))
    return stack + (DETECT_LESS,) + ((MESH,) if neural and mesh else ()) + ((LOW_RES,) if low_res else ())


@dataclass(frozen=True)
class ControllerSettings:
    """How eagerly the controller reacts."""

    min_samples: int = 10
    """Frames encoded since the last change before the p99 is trusted."""
    down_cooldown: float = 1.0
    """Seconds after any change before the next step down."""
    up_ratio: float = 0.6
    """Step up only while the p99 is under this fraction of the budget."""
    up_hold: float = 3.0
    """Seconds the stream must stay under `up_ratio` x budget (and the GPU cool) before a step up."""
    gpu_high: float = 0.9
    """GPU utilisation (0..1) above which the GPU counts as saturated."""
    gpu_high_for: float = 3.0
    """Seconds of saturation before one stream on that GPU steps down (then again after as long)."""
    gpu_low: float = 0.75
    """No stream on a GPU steps up while its utilisation is at or above this."""
    worse_ratio: float = 1.2
    """A step down after which the p99 exceeds this many times the p99 before it made things worse
    (a margin over the p99's own noise between two windows)."""
    futile_hold: float = 30.0
    """Seconds a step down that made things worse is not taken again."""

    def __post_init__(self) -> None:
        if not 0 < self.up_ratio < 1:
            raise ValueError(f"up_ratio must be between 0 and 1 (exclusive), got {self.up_ratio}")
        if not 0 < self.gpu_low < self.gpu_high <= 1:
            raise ValueError(f"need 0 < gpu_low < gpu_high <= 1, got gpu_low={self.gpu_low}, "
                             f"gpu_high={self.gpu_high}")


@dataclass(frozen=True)
class StreamObservation:
    """What the runtime measured for one stream since its last change."""

    stream_id: str
    p99_ms: float | None
    """p99 of arrival-to-encoded latency over the frames since the last change (None: no frames)."""
    samples: int
    """How many frames that p99 is over."""
    budget_ms: float
    """The stream's latency budget."""
    level: int
    """Steps currently applied (0: full quality)."""
    steps: tuple[str, ...]
    """The stream's ladder (`ladder(swapper)`)."""


@dataclass(frozen=True)
class Decision:
    """Move one stream from `old_level` to `new_level` (one step), and why."""

    stream_id: str
    old_level: int
    new_level: int
    step: str
    """The ladder step applied (down) or undone (up)."""
    reason: str

    @property
    def direction(self) -> str:
        return "down" if self.new_level > self.old_level else "up"


@dataclass
class _StreamState:
    last_change: float
    good_since: float | None = None
    before_p99: float | None = None
    """The p99 that led to the last step down (None: the last change was not a step down)."""
    futile: dict[int, float] = field(default_factory=dict)
    """Level -> until when a step down to it is not taken (it did not help)."""


@dataclass
class DegradationController:
    """Decides steps for the streams of one GPU. Call `decide` periodically with fresh observations."""

    settings: ControllerSettings = field(default_factory=ControllerSettings)
    _streams: dict[str, _StreamState] = field(default_factory=dict)
    _hot_since: float | None = None

    def forget(self, stream_id: str) -> None:
        """A stream has gone."""
        self._streams.pop(stream_id, None)

    def decide(self, now: float, streams: list[StreamObservation],
               gpu_util: float | None) -> list[Decision]:
        """Decisions for this tick: at most one step per stream. `gpu_util` in 0..1, None unknown."""
        s = self.settings
        out: list[Decision] = []
        for o in streams:
            st = self._streams.setdefault(o.stream_id, _StreamState(last_change=now))
            if o.p99_ms is None or o.samples < s.min_samples:
                st.good_since = None
                continue
            # A step down is judged once, by the first p99 over enough frames after it: later load
            # changes say nothing about the step.
            before, st.before_p99 = st.before_p99, None
            if o.p99_ms > o.budget_ms:
                st.good_since = None
                if before is not None and o.level > 0 and o.p99_ms > s.worse_ratio * before:
                    step = o.steps[o.level - 1]
                    st.futile[o.level] = now + s.futile_hold
                    out.append(self._change(o, st, now, -1, f"{step} made it worse: p99 {o.p99_ms:.0f} ms "
                                                             f"after it, {before:.0f} ms before; not "
                                                             f"taken again for {s.futile_hold:g} s"))
                    continue
                if (o.level < len(o.steps) and now - st.last_change >= s.down_cooldown
                        and st.futile.get(o.level + 1, 0.0) <= now):
                    out.append(self._change(o, st, now, +1, f"p99 {o.p99_ms:.0f} ms over the "
                                                             f"budget of {o.budget_ms:.0f} ms"))
                continue
            cool = gpu_util is None or gpu_util < s.gpu_low
            if o.p99_ms < s.up_ratio * o.budget_ms and cool:
                if st.good_since is None:
                    st.good_since = now
                if o.level > 0 and now - st.good_since >= s.up_hold and now - st.last_change >= s.up_hold:
                    out.append(self._change(o, st, now, -1, f"p99 {o.p99_ms:.0f} ms under "
                                                             f"{s.up_ratio:.0%} of the budget of "
                                                             f"{o.budget_ms:.0f} ms for {s.up_hold:g} s"))
            else:
                st.good_since = None
        out.extend(self._gpu(now, streams, gpu_util, {d.stream_id for d in out}))
        return out

    def _gpu(self, now: float, streams: list[StreamObservation], util: float | None,
             changed: set[str]) -> list[Decision]:
        s = self.settings
        if util is None or util < s.gpu_high:
            self._hot_since = None
            return []
        if self._hot_since is None:
            self._hot_since = now
        if now - self._hot_since < s.gpu_high_for:
            return []
        # The stream furthest over (or least under) its budget gives way first; a stream comfortably
        # within its budget (under up_ratio of it) does not, however busy the GPU.
        candidates = [o for o in streams if o.level < len(o.steps) and o.stream_id not in changed
                      and o.p99_ms is not None and o.p99_ms >= s.up_ratio * o.budget_ms
                      and self._streams.get(o.stream_id, _StreamState(now)).futile.get(o.level + 1, 0.0) <= now]
        if not candidates:
            return []
        worst = max(candidates, key=lambda o: (o.p99_ms or 0.0) / o.budget_ms)
        st = self._streams.setdefault(worst.stream_id, _StreamState(last_change=now))
        self._hot_since = now  # the next GPU-driven step waits another gpu_high_for
        return [self._change(worst, st, now, +1, f"GPU utilisation {util:.0%} above "
                                                   f"{s.gpu_high:.0%} for {s.gpu_high_for:g} s")]

    @staticmethod
    def _change(o: StreamObservation, st: _StreamState, now: float, delta: int,
                reason: str) -> Decision:
        new = o.level + delta
        step = o.steps[new - 1] if delta > 0 else o.steps[o.level - 1]
        st.last_change = now
        st.good_since = None
        st.before_p99 = o.p99_ms if delta > 0 else None
        return Decision(o.stream_id, o.level, new, step, reason)
