"""The degradation ladder as pure logic: order of steps, cooldown, hysteresis, GPU saturation."""

from __future__ import annotations

import pytest

from swapstream.runtime.controller import (ControllerSettings, DegradationController,
                                           StreamObservation, ladder)

S = ControllerSettings(min_samples=10, down_cooldown=1.0, up_ratio=0.6, up_hold=3.0,
                       gpu_high=0.9, gpu_high_for=3.0, gpu_low=0.75)


def obs(p99: float | None, level: int, swapper: str = "inswapper_128", samples: int = 30,
        sid: str = "a", budget: float = 100.0) -> StreamObservation:
    return StreamObservation(sid, p99, samples, budget, level, ladder(swapper))


def test_ladder_order() -> None:
    assert ladder("inswapper_128") == ("detect_less", "mesh", "low_res")
    assert ladder("mesh") == ("detect_less", "low_res")


def test_steps_down_one_at_a_time_in_order_with_a_cooldown_and_stops_at_the_bottom() -> None:
    c = DegradationController(S)
    level, t, steps = 0, 0.0, []
    for _ in range(40):
        t += 0.25
        for d in c.decide(t, [obs(250.0, level)], None):
            assert d.new_level == level + 1 and d.direction == "down"
            assert "p99 250 ms over the budget of 100 ms" in d.reason
            steps.append((t, d.step))
            level = d.new_level
    assert [s for _, s in steps] == ["detect_less", "mesh", "low_res"]
    assert level == 3
    times = [x for x, _ in steps]
    assert all(b - a >= 1.0 for a, b in zip(times, times[1:]))  # cooldown between steps


def test_too_few_frames_since_a_change_decide_nothing() -> None:
    c = DegradationController(S)
    assert c.decide(10.0, [obs(900.0, 0, samples=9)], None) == []
    assert c.decide(11.0, [obs(None, 0, samples=0)], None) == []


def test_steps_back_up_only_after_holding_well_under_budget() -> None:
    c = DegradationController(S)
    c.decide(0.0, [obs(50.0, 3)], None)  # first sight of the stream
    # 80 ms is under the budget but not under 60% of it: inside the hysteresis band, no change.
    for t in range(1, 20):
        assert c.decide(float(t), [obs(80.0, 3)], None) == []
    # Well under: a step up after up_hold (3 s), then the next one 3 s later, not before.
    ups = []
    level = 3
    t = 20.0
    while t < 40 and level > 0:
        t += 0.5
        for d in c.decide(t, [obs(40.0, level)], None):
            assert d.direction == "up"
            ups.append((t, d.step))
            level = d.new_level
    assert [s for _, s in ups] == ["low_res", "mesh", "detect_less"]
    assert ups[0][0] - 20.0 >= 3.0
    assert all(b - a >= 3.0 for (a, _), (b, _) in zip(ups, ups[1:]))
    # A spike resets the hold: no step up for another 3 s.
    c2 = DegradationController(S)
    c2.decide(0.0, [obs(40.0, 1)], None)
    c2.decide(2.5, [obs(40.0, 1)], None)
    c2.decide(2.6, [obs(90.0, 1)], None)
    assert c2.decide(3.1, [obs(40.0, 1)], None) == []
    assert c2.decide(5.5, [obs(40.0, 1)], None) == []
    assert [d.step for d in c2.decide(6.2, [obs(40.0, 1)], None)] == ["detect_less"]


def test_a_saturated_gpu_steps_down_the_worst_stream_and_blocks_steps_up() -> None:
    c = DegradationController(S)
    streams = [obs(50.0, 0, sid="calm"), obs(90.0, 0, sid="tight")]
    assert c.decide(0.0, streams, 0.95) == []
    assert c.decide(2.0, streams, 0.95) == []
    c.decide(2.5, streams, 0.5)  # a dip resets the saturation timer
    assert c.decide(5.0, streams, 0.95) == []
    d = c.decide(8.1, streams, 0.95)
    assert [(x.stream_id, x.step) for x in d] == [("tight", "detect_less")]
    assert "GPU utilisation 95% above 90% for 3 s" in d[0].reason
    # A hot GPU (over gpu_low) keeps a well-behaved degraded stream where it is.
    c3 = DegradationController(S)
    for t in range(0, 10):
        assert c3.decide(float(t), [obs(10.0, 2)], 0.8) == []


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="up_ratio must be between 0 and 1"):
        ControllerSettings(up_ratio=1.2)
    with pytest.raises(ValueError, match="need 0 < gpu_low < gpu_high <= 1"):
        ControllerSettings(gpu_low=0.95, gpu_high=0.9)


def test_ladder_without_low_res() -> None:
    # Streams on a GPU: frames are swapped on the device at full size, so low_res is not offered.
    assert ladder("inswapper_128", low_res=False) == ("detect_less", "mesh")
    assert ladder("mesh", low_res=False) == ("detect_less",)


def test_ladder_without_the_mesh_fallback() -> None:
    # Streams on a GPU: the mesh swap costs the device thread more than the neural swap.
    assert ladder("inswapper_128", low_res=False, mesh=False) == ("detect_less",)
    assert ladder("inswapper_128", low_res=False, mesh=False, enhancer=True) == ("enhancer_off", "detect_less")
    assert ladder("mesh", low_res=False, mesh=False) == ("detect_less",)


def test_face_stack_steps_come_first_enhancer_then_region() -> None:
    assert ladder("inswapper_128", enhancer=True, region=True) == (
        "enhancer_off", "region_off", "detect_less", "mesh", "low_res")
    assert ladder("inswapper_128", low_res=False, region=True) == ("region_off", "detect_less", "mesh")
    # The mesh swapper runs neither network, so it has neither step.
    assert ladder("mesh", enhancer=True, region=True) == ("detect_less", "low_res")


def test_an_over_budget_stream_drops_the_enhancer_then_the_parser_before_the_detector_cadence() -> None:
    c = DegradationController(S)
    steps = ladder("inswapper_128", enhancer=True, region=True)
    level, t, applied = 0, 0.0, []
    while len(applied) < 3 and t < 20:
        t += 0.25
        for d in c.decide(t, [StreamObservation("a", 250.0, 30, 100.0, level, steps)], None):
            applied.append(d.step)
            level = d.new_level
    assert applied == ["enhancer_off", "region_off", "detect_less"]


def test_a_step_that_makes_it_worse_is_undone_and_not_taken_again_for_a_while() -> None:
    c = DegradationController(S)
    t, level, applied = 0.0, 0, []

    def tick(p99: float) -> None:
        nonlocal level
        for d in c.decide(t, [obs(p99, level)], None):
            applied.append((d.direction, d.step, d.reason))
            level = d.new_level

    tick(120.0)  # the first observation starts the stream's cooldown
    t = 1.0
    tick(120.0)  # over budget: detect_less
    t = 2.5
    tick(110.0)  # better but still over: mesh
    assert [a[:2] for a in applied] == [("down", "detect_less"), ("down", "mesh")]
    t = 4.0
    tick(400.0)  # mesh made it far worse (> 1.2 x 110 ms): back up, said why
    assert applied[-1][:2] == ("up", "mesh") and "mesh made it worse: p99 400 ms after it, 110 ms before" \
        in applied[-1][2] and level == 1
    # Still over budget at detect_less: the mesh step is not taken again within futile_hold...
    for t in (5.5, 10.0, 20.0, 33.0):
        tick(110.0)
    assert level == 1 and len(applied) == 3
    # ...and is tried again after it.
    t = 35.0
    tick(110.0)
    assert level == 2 and applied[-1][:2] == ("down", "mesh")


def test_a_saturated_gpu_leaves_streams_comfortably_within_budget_alone() -> None:
    c = DegradationController(S)
    decided = []
    for i in range(40):
        # 32 streams at 30% of their budget on a GPU at 98%: nothing to fix.
        decided += c.decide(i * 0.5, [obs(30.0, 0, sid=f"s{k}") for k in range(32)], 0.98)
    assert decided == []
    # One stream near its budget is the one that gives way.
    for i in range(40, 50):
        decided += c.decide(i * 0.5, [obs(30.0, 0, sid=f"s{k}") for k in range(31)] + [obs(90.0, 0, sid="near")], 0.98)
    assert decided and {d.stream_id for d in decided} == {"near"}


def test_a_step_is_judged_once_by_the_first_window_after_it() -> None:
    c = DegradationController(S)
    level, t, applied = 0, 0.0, []
    for t, p99 in ((0.0, 120.0), (1.0, 120.0), (2.0, 50.0), (3.0, 50.0)):
        for d in c.decide(t, [obs(p99, level)], None):
            applied.append(d.step)
            level = d.new_level
    assert applied == ["detect_less"] and level == 1  # it helped (50 ms < 1.2 x 120 ms), kept
    # Much later the load rises: far over 1.2 x the p99 before the old step, but that step was
    # judged already, so this is a new step down, not an undo.
    for d in c.decide(10.0, [obs(400.0, level)], None):
        applied.append(f"{d.direction} {d.step}")
        level = d.new_level
    assert applied[-1] == "down mesh" and level == 2
