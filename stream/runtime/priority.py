"""Control before media: the scheduling choices that keep the API answering while streams saturate
the machine.

The control API and the streams share one process, one event loop and one GIL. Measured on 2 cores
with 8-16 file streams decoding and swapping flat out, `/healthz` waited for CPU time and for the GIL
behind the media threads, not behind queued media callbacks (a second, idle event loop in the same
process answered no faster than the busy one). Two things help, and cost the streams little:

- media threads (each stream's reader, analysis and encoding threads, each device's swap thread)
  run at a lower OS priority than the rest of the process (`MEDIA_NICE`), and so do the native
  threads they start (FFmpeg's decoders, LiteRT, x264 inherit it), so that the event loop gets a core
  as soon as a request arrives;
- the interpreter hands the GIL over more often (`runtime.switch_interval_ms`, 1 ms by default),
  so that the loop thread, once it runs, waits about 1 ms rather than 5 ms for each of the media
  threads ahead of it.

The same wait falls on every hand-over of a frame between threads (reader -> loop -> analysis
thread -> loop -> swap thread ...) whenever another thread is running Python: measured with
`tools/probe_gil_hops.py` on 2 cores (docs/benchmarks/gil_hops.md), one trip through a
`DynamicBatcher` and its executor thread took 0.07 ms alone, and 3.2 ms (p50) beside one thread
that runs Python without pause at a 1 ms interval (15.7 ms at Python's 5 ms; 0.6 ms at 0.2 ms).
On the CPU path the other threads are mostly in native code (LiteRT, FFmpeg, NumPy):
docs/benchmarks/run_cpu_variants.md times `swapstream run` at 0.2 ms against 1 ms, and
docs/benchmarks/run_gpu_live.md on the H200 (167.5 against 142.6 fps, within the runs' spread).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MEDIA_NICE = 10
"""How much nicer than the process's own priority media threads run (Linux nice levels, 0..19):
at +10 the kernel gives a runnable control thread about 10 times the CPU share of a media thread.
Media threads still use every idle core: the niceness only decides who goes first."""

def media_thread(nice: int = MEDIA_NICE) -> None:
    """Make the calling thread a media thread: `nice` levels below the control loop's priority, which
    the native threads it starts from now on inherit (`runtime.media_nice`; 0 leaves it). Linux only
    (elsewhere the nice value belongs to the whole process, so it is left alone); best effort: a
    refusal leaves the thread as it was."""
    if not sys.platform.startswith("linux") or nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
    except OSError as e:  # a sandbox without setpriority: the streams run, only without the order
        log.debug("could not lower the priority of media thread %d: %s", tid, e)


class SwitchInterval:
    """Lowers the GIL switch interval while at least one runtime runs, and puts the previous value
    back when the last one closes (tests start many runtimes). The interval is the interpreter's,
    one for the process: the lowest that any runtime asked for since the first one started (a
    runtime that closes while others run leaves it as it is)."""

    _lock = threading.Lock()
    _users = 0
    _before = 0.0

    @classmethod
    def acquire(cls, seconds: float) -> None:
        with cls._lock:
            if cls._users == 0:
                cls._before = sys.getswitchinterval()
            sys.setswitchinterval(min(sys.getswitchinterval(), seconds))
            cls._users += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            if cls._users == 0:
                return
            cls._users -= 1
            if cls._users == 0:
                sys.setswitchinterval(cls._before)
