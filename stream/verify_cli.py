"""`swapstream verify FILE_OR_URL`: is SwapStream's watermark in this video, and what does it say?

Exit status: 0 when a mark was found (in some frame, or in all frames taken together), 1 when none
was, 2 for input that cannot be read (with one `error:` line, as every command).
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from .console import err, out
from .verify import KEEP_FRAMES, FrameResult, VerifyReport, verify


def _frame_line(r: FrameResult) -> Text:
    t = f"{r.time:9.3f}s" if r.time is not None else "        -"
    if r.found:
        return Text(f"frame {r.index:6d}  {t}  marked     {r.payload}  score {r.score:.2f}")
    return Text(f"frame {r.index:6d}  {t}  no mark    ({r.reason}, score {r.score:.2f})")


def _is_synthetic_tag(value: str) -> bool:
    v = value.lower()
    return "ai-modified" in v or "synthetic" in v or "trainedalgorithmicmedia" in v


def _summary(rep: VerifyReport) -> None:
    n = rep.frame_count
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("input", Text(rep.source))
    t.add_row("frames", f"{n} ({rep.width}x{rep.height})")
    t.add_row("marked frames", f"{rep.marked} ({100.0 * rep.marked / n:.1f}%)" if n else "0")
    for p, count in rep.payloads.most_common():
        t.add_row("payload", Text(f"{p}: {count} frames"))
    if rep.combined is not None:
        c = rep.combined
        t.add_row("all frames together", Text(f"marked, {c.payload}, score {c.score:.2f}" if c.found
                                              else f"no mark ({c.reason}, score {c.score:.2f})"))
    # Every level: an HLS segment keeps the note only in its MPEG-TS service names.
    synthetic = [(k if where == "format" else f"{where}: {k}", v)
                 for where, tags in (rep.tags or {"format": rep.metadata}).items()
                 for k, v in tags.items() if _is_synthetic_tag(v)]
    t.add_row("metadata", Text("; ".join(f"{k}={v}" for k, v in synthetic)
                               if synthetic else "no synthetic-content tags"))
    if rep.stopped_early:
        t.add_row("note", Text(rep.stopped_early))
    t.add_row("result", Text("SwapStream watermark FOUND: this video was modified by SwapStream"
                             if rep.found else "no SwapStream watermark found"))
    out.print(t)


def verify_command(
    source: Annotated[str, typer.Argument(help="Video file or stream URL (http, rtmp, ...).",
                                          metavar="FILE_OR_URL")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of text: "
                                                         f"the first {KEEP_FRAMES} frames, the number "
                                                         "left out, and the summary of all.")] = False,
    summary_only: Annotated[bool, typer.Option("--summary", help="Print only the summary.")] = False,
    max_frames: Annotated[Optional[int], typer.Option(min=1, help="Stop after this many frames "
                                                      "(for endless streams).")] = None,
) -> None:
    """Check a video for SwapStream's invisible watermark, frame by frame and in summary.

    Exit status 0: a mark was found; 1: no mark; 2: the input could not be read.
    """
    # soft_wrap: one frame, one line, whatever the terminal's width (scripts grep these lines).
    show = None if as_json or summary_only else (lambda r: out.print(_frame_line(r), soft_wrap=True))
    # Text shows each frame as it comes and keeps none; JSON keeps the first KEEP_FRAMES. The summary
    # counts every frame either way, so memory stays bounded on an endless stream.
    rep = verify(source, max_frames=max_frames, on_frame=show, keep_frames=KEEP_FRAMES if as_json else 0)
    if as_json:
        typer.echo(json.dumps(rep.to_dict(), indent=2))
    else:
        _summary(rep)
    if not rep.found:
        err.print(Text("no SwapStream watermark found"))
        raise typer.Exit(1)
