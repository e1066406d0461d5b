"""Frame-number stamps: each frame carries its number in a corner, in big black/white blocks that
survive lossy coding, so that a frame that comes out of SwapStream can be matched to the frame it came
from whatever was dropped on the way.

NumPy only, so that tests and tools that need nothing else (the runtime's pure-logic tests) import it
without PyAV or aiortc; `tests.helpers.probe` builds its measurable media on it.
"""

from __future__ import annotations

import numpy as np

BITS = 8
"""Blocks per stamp: frame numbers are stamped mod 2**BITS."""


def stamp(img: np.ndarray, n: int, cell: int = 16) -> None:
    """Write n mod 256 into the top-left corner: bit b is block b, white for 1, black for 0."""
    for b in range(BITS):
        img[0:cell, b * cell:(b + 1) * cell] = 255 if (n >> b) & 1 else 0


def read_stamp(img: np.ndarray, cell: int = 16) -> int:
    """The number `stamp` wrote, reading each block's middle (codecs blur the block edges)."""
    m = cell // 5
    return sum(1 << b for b in range(BITS)
               if img[m:cell - m, b * cell + m:(b + 1) * cell - m].mean() > 128)
