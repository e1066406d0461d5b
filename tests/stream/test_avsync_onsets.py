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
