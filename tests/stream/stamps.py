"""Frame numbers drawn into a corner as big black/white blocks, read back after lossy coding.

Live tests stamp every source frame, so that each frame that comes out of SwapStream can be matched
to the frame it came from (for pixels and for latency), whatever was dropped on the way.
"""

from __future__ import annotations

import numpy as np

BITS = 8


def stamp(img: np.ndarray, n: int, cell: int = 16) -> None:
    """Write n mod 256 into the top-left corner: bit b is block b, white for 1, black for 0."""
    for b in range(BITS):
        img[0:cell, b * cell:(b + 1) * cell] = 255 if (n >> b) & 1 else 0


def read_stamp(img: np.ndarray, cell: int = 16) -> int:
    """The number `stamp` wrote, reading each block's middle (codecs blur the block edges)."""
    m = cell // 5
    return sum(1 << b for b in range(BITS)
               if img[m:cell - m, b * cell + m:(b + 1) * cell - m].mean() > 128)
