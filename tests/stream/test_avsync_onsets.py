"""The A/V sync tests' own instrument (`tests.helpers.avsync.onsets`): it finds the source's tone
onsets, and no onset where a reconnect splices one connection's silence onto the next one's tone."""

from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")  # tests.helpers.avsync imports PyAV

from ..helpers.avsync import RATE, SAMPLES, onsets, tone  # noqa: E402


def packets(spans: list[tuple[float, float]]) -> list[tuple[np.ndarray, float]]:
    """Output audio made of source spans (start, end) in seconds, each placed right after the last,
    without a gap: what a reconnect's timeline gives out. Packets of SAMPLES, as AAC decodes."""
    out: list[tuple[np.ndarray, float]] = []
    t = 0.0
    for a, b in spans:
        s = round(a * RATE)
        while s + SAMPLES <= round(b * RATE):
            out.append((tone(s, SAMPLES), t))
            s += SAMPLES
            t += SAMPLES / RATE
    return out


def test_onsets_of_an_unbroken_source_are_found_with_their_seconds() -> None:
    found = onsets(packets([(0.5, 9.5)]))
    # Source second 2k sounds from output time 2k - 0.5; it names k mod 16.
    assert [(round(at - (2 * k - 0.5), 3), code) for (at, code), k in zip(found, (1, 2, 3, 4))] == \
        [(0.0, 1), (0.0, 2), (0.0, 3), (0.0, 4)]
    assert len(found) == 4


@pytest.mark.parametrize("new_from", [14.98, 14.9, 14.5, 14.05])
def test_a_splice_from_silence_into_a_tone_caught_mid_second_is_not_an_onset(new_from: float) -> None:
    # The old connection stops 0.45 s into a silent second; the new one's audio starts inside an
    # even (sounding) second. The output is continuous; the next real onsets are sources 16 and 18.
    audio = packets([(0.5, 9.45), (new_from, 18.5)])
    found = onsets(audio)
    seam = 9.45 - 0.5
    assert [code for _, code in found] == [1, 2, 3, 4, 8, 9], found  # 9: source 18, cut by the end
    assert all(abs(at - seam) > 0.5 for at, _ in found)


def test_a_tone_cut_short_by_a_gap_still_counts() -> None:
    # A timestamp jump's seam can leave a gap in the output audio inside a tone: its length is then
    # unknown, and the onset before it stands (its frequency was read over 0.2 s).
    audio = packets([(0.5, 4.5)])
    t_end = audio[-1][1] + SAMPLES / RATE
    later = [(x, t + t_end + 0.2) for x, t in packets([(4.5, 9.5)])]  # 0.2 s of nothing, mid-tone
    found = onsets(audio + later)
    assert [code for _, code in found] == [1, 2, 3, 4], found


def test_an_onset_in_the_video_gap_at_a_seam_is_not_paired_across_it() -> None:
    """`skews` at a reconnect's seam: the output's timeline closed a 4.5 s outage in both streams
    alike (A and V in step), but the first frames after it were dropped, so a tone onset plays while
    the last frame before the outage is still on screen. Paired with that frame it would read as a
    4.5 s skew (the soak saw 4.7 s); it is left out, and the onsets after it measure 0."""
    from ..helpers.avsync import Session, skews

    fps = 10
    # Epoch 1: source 0.5-9.45 s at output 0-8.95 s. Epoch 2: source 13.98 s on, at output 8.95 s.
    audio = packets([(0.5, 9.45), (13.98, 20.5)])
    shift2 = 8.95 - 13.98
    video = [(n, n / fps - 0.5, n / fps + 0.05) for n in range(5, 95)]  # up to output 8.9 s
    # Source frames 14.0 s (output 8.97 s, where the onset of source second 14 plays) missing.
    video += [(n, n / fps + shift2, n / fps + 0.05) for n in range(141, 205)]
    found = skews(Session(video=video, audio=audio), fps, 0.0)
    sources = [src for _, src, _ in found]
    assert 14.0 not in sources, found
    assert {16.0, 18.0} <= set(sources), found  # the onsets after the seam are measured
    assert all(abs(sk) < 0.02 for _, _, sk in found), found  # 20 ms: one AAC packet and rounding
