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
- the interpreter hands the GIL over more often (`SWITCH_INTERVAL_S`), so that the loop thread,
  once it runs, waits about 1 ms rather than 5 ms for each of the media threads ahead of it.
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

SWITCH_INTERVAL_S = 0.001
"""The GIL switch interval while a runtime runs (Python's default is 5 ms)."""


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
    """Lowers the GIL switch interval to `SWITCH_INTERVAL_S` while at least one runtime runs, and
    puts the previous value back when the last one closes (tests start many runtimes)."""

    _lock = threading.Lock()
    _users = 0
    _before = 0.0

    @classmethod
    def acquire(cls) -> None:
        with cls._lock:
            if cls._users == 0:
                cls._before = sys.getswitchinterval()
                sys.setswitchinterval(min(cls._before, SWITCH_INTERVAL_S))
            cls._users += 1

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            if cls._users == 0:
                return
            cls._users -= 1
            if cls._users == 0:
                sys.setswitchinterval(cls._before)
