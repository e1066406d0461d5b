"""`delivered_rate`: the frame rate a live output declares, measured from when its frames went out.
Pure logic over output times; each case is a pattern a real output shows."""

from __future__ import annotations

from fractions import Fraction

import pytest

from swapstream.live.streams import delivered_rate


def times(gaps: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)]
    for g in gaps:
        out.append(out[-1] + g)
    return out


def test_a_steady_output_declares_its_rate() -> None:
    assert delivered_rate(times([Fraction(1, 30)] * 29)) == 30


@pytest.mark.parametrize("eps_ms", [45, 5])
@pytest.mark.parametrize("burst", [2, 3, 4])
@pytest.mark.parametrize("cut", [0, 1, 3])
def test_a_swap_that_hands_out_bursts_declares_the_average_rate(burst: int, eps_ms: int, cut: int) -> None:
    """A slow swap (0.15 s a frame) takes the frames that queued while the last batch ran together,
    so frames go out `burst` at a time, `eps_ms` apart (the encode), then wait for the next batch. CI
    once declared 22 fps for 7 delivered: the median gap was a burst's, and the batches' gaps were
    left out as if they were outages. The window holds whole bursts and then `cut` more short gaps
    (a window starts and ends anywhere)."""
    eps, swap = Fraction(eps_ms, 1000), Fraction(15, 100)
    gaps = ([eps] * (burst - 1) + [burst * swap - (burst - 1) * eps]) * 4 + [eps] * min(cut, burst - 1)
    rate = delivered_rate(times(gaps))
    assert rate == Fraction(len(gaps)) / sum(gaps)  # every gap counts: the average over the window
    # Near the swap's rate: a window of 4 bursts that ends in a burst's short gaps averages up to 16%
    # above it (that is what the window delivered); leaving out the batches' gaps gave 3 times it.
    assert abs(rate - 1 / swap) <= Fraction(1, 5) / swap, float(rate)


def test_an_outage_is_left_out() -> None:
    """A reconnection measures the frames before and after an outage: the outage is not the rate,
    however long it is against the window."""
    f = Fraction(1, 30)
    for outage in (Fraction(1), Fraction(10), Fraction(60)):
        assert delivered_rate(times([f] * 40 + [outage] + [f] * 20)) == 30, outage
    # Few frames, as a writer's first hold can be (frames dropped while the job warmed up).
    assert delivered_rate(times([f, f, Fraction(2)])) == 30
    # Two outages, the second shorter than the first but still many frames long.
    assert delivered_rate(times([f] * 30 + [Fraction(20)] + [f] * 30 + [Fraction(2)] + [f] * 30)) == 30


def test_too_few_frames_or_no_time_give_nothing() -> None:
    assert delivered_rate([]) is None
    assert delivered_rate([Fraction(1)]) is None
    assert delivered_rate([Fraction(1), Fraction(1)]) is None
