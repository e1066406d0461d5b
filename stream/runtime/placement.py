"""The placement policy of `serve --workers N` and `serve --ray`: which worker a new stream goes to.

One pure policy for every launcher (local worker processes, Ray actors) and for the placement
simulator (tools/placement_sim.py), so that what the simulator reports is what the server does.

A worker is judged by what it last reported (`/worker/load`, runtime.worker.load_report), summed up
once per report in a `Headroom`:
- its device thread's busy share over the last seconds (the device time its streams take: GPU ms per
  frame times their frame rates, over wall time) and, from it, what one more stream would add: the
  mean of its streams of the new stream's swapper where it has some (a mesh stream costs a GPU
  several times a neural one), else what other workers report such a stream costs, else the mean of
  all its streams;
- each running stream's p99 against its latency budget;
- the arrival phases of its streams (where in a frame period each stream's frames arrive);
- whether its models verified.

A worker takes no new stream when it is not ready, its models did not verify, it holds its most
streams, its busy share with one more stream would pass BUSY_MAX, or one of its streams is over its
budget. Among the others the stream goes to the lowest load (the higher of the busy share it would
have with the new stream, the streams placed since its report counted, and the worst p99/budget, in
steps of 0.1), then the fewest streams whose frames arrive near the new
stream's phase (when that phase is known: a stream moved after its worker died), then the fewest
streams, then the first worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

OVER_BUDGET = 1.0
"""A worker one of whose streams has its p99 above this fraction of its budget takes no new stream."""
BUSY_MAX = 0.95
"""A worker whose busier device thread (swap or analysis) would be busy more than this share of the
time with one more stream takes none: the rest is the slack that absorbs bursts (keyframes, many
faces at once)."""
FALLBACK_COST = 0.05
"""What one stream is taken to add to a worker's busy share when no worker's report can tell yet
(none holds a reported stream): small, so that it decides only between workers otherwise alike."""
PHASE_WINDOW = 0.125
"""Two streams whose frames arrive within this fraction of a frame period of each other collide:
their frames wait for the device together."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """One worker's last load report as placement reads it (computed once per report)."""

    busy: float = 0.0
    """The device thread's busy share over the last seconds (0..1)."""
    reported_streams: int = 0
    """Streams the report counted (those the parent placed since are not in `busy` yet)."""
    settled_streams: int | None = None
    """Of those, the ones running long enough for `busy` to hold their cost (None: all of them, a
    report without the figure)."""
    max_streams: int = 0
    """The worker's `runtime.max_streams` (0: the parent's default)."""
    worst: tuple[str, float] | None = None
    """The stream with the highest p99/budget, and that ratio."""
    phases: tuple[float, ...] = ()
    """The arrival phase of each of its streams, as a fraction of a frame period (0..1)."""
    costs: dict[str, float] = field(default_factory=dict, hash=False)
    """Swapper -> what one of its settled streams of that swapper adds to `busy` (the report's
    `costs`; empty: the report does not say)."""
    models: str | None = None
    """Why its models did not verify (None: they did, or the report does not say)."""
    per_stream: float = field(init=False)
    """What one more stream adds to `busy`, judged by its settled streams: their mean share (0: none)."""
    over: bool = field(init=False)
    """One of its streams is over its budget."""
    worst_ratio: float = field(init=False)
    """The worst p99/budget (0 when no stream has one)."""

    costed: int = field(init=False)
    """The streams whose cost `busy` holds: the settled ones where the report says, else all."""

    def __post_init__(self) -> None:
        # Computed once per report: `choose` reads them for every worker on every placement.
        object.__setattr__(self, "costed", self.reported_streams if self.settled_streams is None
                           else min(self.settled_streams, self.reported_streams))
        object.__setattr__(self, "per_stream", self.busy / self.costed if self.costed else 0.0)
        object.__setattr__(self, "over", self.worst is not None and self.worst[1] > OVER_BUDGET)
        object.__setattr__(self, "worst_ratio", self.worst[1] if self.worst else 0.0)


def headroom(report: Mapping[str, Any]) -> Headroom:
    """Sum up a `/worker/load` report (an empty one, before the first report: an idle worker)."""
    ratios = report.get("p99_over_budget") or {}
    worst = max(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    phases = report.get("phases") or {}
    settled = report.get("settled")
    return Headroom(busy=float(report.get("busy", 0.0)), reported_streams=int(report.get("streams", 0)),
                    settled_streams=None if settled is None else int(settled),
                    max_streams=int(report.get("max_streams", 0)),
                    worst=(str(worst[0]), float(worst[1])) if worst else None,
                    phases=tuple(float(v) for v in phases.values()), models=report.get("models"),
                    costs={str(k): float(v) for k, v in (report.get("costs") or {}).items()})


class Placeable(Protocol):
    """What placement needs of a worker: its name, its state and its last report's summary."""

    name: str
    state: str
    headroom: Headroom


W = TypeVar("W", bound=Placeable)


class NoRoom(Exception):
    """No worker takes the stream: `reasons` holds each worker's."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons) or "no workers")
        self.reasons = reasons


def crowding(phases: Sequence[float], phase: float) -> int:
    """How many of `phases` lie within PHASE_WINDOW of `phase` on the circle of one frame period."""
    n = 0
    for p in phases:
        d = abs(p - phase) % 1.0
        if min(d, 1.0 - d) < PHASE_WINDOW:
            n += 1
    return n


def stream_cost(workers: Sequence[Placeable]) -> float:
    """What one stream adds to a busy share, judged by every worker that reported settled streams
    (their mean per stream); FALLBACK_COST when none did. Used for a worker whose own report holds
    none."""
    known = [w.headroom.per_stream for w in workers if w.headroom.costed]
    return sum(known) / len(known) if known else FALLBACK_COST


def mean_by_swapper(parts: Iterable[tuple[str, float]]) -> dict[str, float]:
    """A load report's `costs`: the mean of the (swapper, busy share) parts of its settled streams,
    per swapper (`runtime.worker.load_report` from measured shares, `SimWorker` from exact ones)."""
    by: dict[str, list[float]] = {}
    for swapper, part in parts:
        by.setdefault(swapper, []).append(part)
    return {k: sum(v) / len(v) for k, v in by.items()}


def new_stream_cost(h: Headroom, one: float, swapper: str | None, kind_cost: float | None) -> float:
    """What a new stream of `swapper` adds to a worker whose other streams cost `one` each: what its
    report says its streams of that swapper cost, else `kind_cost` (what other workers' reports
    say), else `one`."""
    if swapper is None:
        return one
    return h.costs.get(swapper, kind_cost if kind_cost is not None else one)


def projected_busy(h: Headroom, held: int, cost: float, swapper: str | None = None,
                   kind_cost: float | None = None) -> float:
    """The busy share of a worker with one more stream: its report's, plus a stream's cost for each
    stream not in it (placed since the report, or still starting: their swappers are not known here)
    at its own settled streams' mean when it has some, else `cost`; and the new one's
    (`new_stream_cost`). `choose` applies the same rule inline."""
    one = h.per_stream if h.costed else cost
    return h.busy + one * max(0, held - h.costed) + new_stream_cost(h, one, swapper, kind_cost)


def refusal(w: Placeable, held: int, default_max: int, cost: float = FALLBACK_COST,
            swapper: str | None = None, kind_cost: float | None = None) -> str | None:
    """Why `w` takes no new stream now (None: it takes one). `held`: the streams the parent placed on
    it, those being created included (a burst of creates must spread before the next reports show
    them); `cost`: a stream's busy share where the worker's own report cannot tell (`stream_cost`);
    `swapper`: the new stream's, and `kind_cost` what other workers' reports say one costs
    (`projected_busy`)."""
    if w.state != "ready":
        return f"{w.name}: {w.state}"
    h = w.headroom
    if h.models is not None:
        return f"{w.name}: its models did not verify ({h.models})"
    cap = h.max_streams or default_max
    if held >= cap:
        return f"{w.name}: {held} streams, its most (runtime.max_streams {cap})"
    projected = projected_busy(h, held, cost, swapper, kind_cost)
    if projected > BUSY_MAX:
        return (f"{w.name}: device thread busy {h.busy:.0%} of the time, {projected:.0%} with one more "
                f"stream")
    if h.over:
        assert h.worst is not None
        return f"{w.name}: stream {h.worst[0]} is over its latency budget (p99 at {h.worst[1]:.0%} of it)"
    return None


def choose(workers: Sequence[W], held: Callable[[W], int], default_max: int, *,
           phase: float | None = None, cost: float | None = None, exclude: W | None = None,
           swapper: str | None = None) -> W:
    """The worker a new stream goes to (see the module's docstring); NoRoom with every worker's
    reason when none takes it. `cost`: a stream's busy share where a worker's report cannot tell
    (default: `stream_cost`); `swapper`: the new stream's, whose cost a report may give. One pass
    over the workers' reports for that cost, one over the workers, and one over those whose report
    holds no stream (few): this runs on every create and every move, and the simulator calls it for
    1,000 GPUs, so the checks of `refusal` and `projected_busy` are written out inline."""
    best: W | None = None
    best_key: tuple[int, int, int, int] = (0, 0, 0, 0)
    known, known_sum = 0, 0.0
    # The new stream's swapper's cost as the workers that run some report it: charged to a worker
    # that runs none (a GPU of neural streams that takes its first mesh stream, which costs several
    # times one of them, passed its budget when charged its own mean per stream).
    kind_cost = None
    if swapper is not None:
        of_kind = [c for w in workers if (c := w.headroom.costs.get(swapper)) is not None]
        kind_cost = sum(of_kind) / len(of_kind) if of_kind else None
    unreported: list[tuple[int, W, int]] = []
    for i, w in enumerate(workers):
        h = w.headroom
        rs = h.costed
        if rs:
            known += 1
            known_sum += h.per_stream
        if w is exclude or w.state != "ready":
            continue
        n = held(w)
        if h.models is not None or h.over or n >= (h.max_streams or default_max):
            continue
        if not rs:
            unreported.append((i, w, n))
            continue
        projected = (h.busy + h.per_stream * (n - rs if n > rs else 0)
                     + new_stream_cost(h, h.per_stream, swapper, kind_cost))
        if projected > BUSY_MAX:
            continue
        # Ranked by the load it would have (in tenths), streams placed since its report included:
        # ranked by its report alone, a worker that reported idle took every stream of a burst (an
        # H200 run put 13 of 32 streams on one of 8 workers so).
        load = int((projected if projected > h.worst_ratio else h.worst_ratio) * 10 + 0.5)
        if best is not None and load > best_key[0]:
            continue
        key = (load, crowding(h.phases, phase) if phase is not None else 0, n, i)  # ties: the first
        if best is None or key < best_key:
            best, best_key = w, key
    est = cost if cost is not None else (known_sum / known if known else FALLBACK_COST)  # stream_cost()
    for i, w, n in unreported:
        h = w.headroom
        projected = h.busy + est * max(0, n - h.costed) + new_stream_cost(h, est, swapper, kind_cost)
        if projected > BUSY_MAX:
            continue
        load = int((projected if projected > h.worst_ratio else h.worst_ratio) * 10 + 0.5)
        key = (load, crowding(h.phases, phase) if phase is not None else 0, n, i)
        if best is None or key < best_key:
            best, best_key = w, key
    if best is None:
        raise NoRoom([r for w in workers if w is not exclude
                      and (r := refusal(w, held(w), default_max, est, swapper, kind_cost)) is not None])
    return best


@dataclass
class SimWorker:
    """A worker of the placement simulator: a GPU whose busy share is the sum of its streams' costs
    (their GPU ms per frame times their frame rates). It satisfies `Placeable`."""

    name: str
    state: str = "ready"
    streams: dict[int, tuple[float, float, str]] = field(default_factory=dict)
    """Stream id: (cost as a busy share, arrival phase, swapper)."""
    max_streams: int = 64
    headroom: Headroom = field(default_factory=Headroom)

    def report(self) -> None:
        """What its load report would say now (a GPU within its budget: no stream over it)."""
        busy = sum(c for c, _, _ in self.streams.values())
        self.headroom = Headroom(busy=busy, reported_streams=len(self.streams), max_streams=self.max_streams,
                                 phases=tuple(p for _, p, _ in self.streams.values()),
                                 costs=mean_by_swapper((k, c) for c, _, k in self.streams.values()))
