"""`swapstream verify FILE_OR_URL`: is SwapStream's watermark in this video, what does it say, and
what do its C2PA Content Credentials declare?

Exit status: 0 when a mark was found (in some frame, or in all frames taken together) or a C2PA
manifest made by SwapStream validates, 1 when neither, 2 for input that cannot be read (with one
`error:` line, as every command).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from .console import err, out
from .errors import InputError, InputNotFoundError
from .provenance import ManifestCheck
from .verify import KEEP_FRAMES, V2_WINDOW_S, FrameResult, VerifyReport, WindowResult, verify


def _frame_line(r: FrameResult) -> Text:
    t = f"{r.time:9.3f}s" if r.time is not None else "        -"
    if r.found:
        return Text(f"frame {r.index:6d}  {t}  marked     {r.payload}  score {r.score:.2f}")
    return Text(f"frame {r.index:6d}  {t}  no mark    ({r.reason}, score {r.score:.2f})")


def _window_line(w: WindowResult) -> Text:
    t = f"{w.start:9.3f}s" if w.start is not None else "        -"
    if w.found:
        return Text(f"window {w.index:5d}  {t}  v2 marked  {w.payload}  score {w.score:.2f}  ({w.frames} frames)")
    return Text(f"window {w.index:5d}  {t}  v2 no mark ({w.reason}, score {w.score:.2f}, {w.frames} frames)")


def _is_synthetic_tag(value: str) -> bool:
    v = value.lower()
    return "ai-modified" in v or "synthetic" in v or "trainedalgorithmicmedia" in v


def _c2pa_line(c: ManifestCheck) -> str:
    if c.verdict in ("valid", "trusted"):
        acts = ", ".join(f"{a} ({t.rsplit('/', 1)[-1]})" if t else a for a, t in c.actions) or "no actions"
        mark = ""
        if c.watermark is not None:
            mark = f"; declares mark stream {int(c.watermark.get('stream_id', 0)):#010x}"
        return (f"{c.verdict.upper()}: {c.generator or 'unknown generator'}, signed by {c.signer or '?'}; "
                f"{acts}{mark}; {c.detail}")
    return f"{c.verdict.upper()}: {c.detail}"


def _trust(path: Path | None) -> bytes | None:
    """The --trust file's PEM certificates, checked, or None."""
    if path is None:
        return None
    if not path.is_file():
        raise InputNotFoundError(f"--trust '{path}' is not a file. Give a PEM file of CA certificates "
                                 f"(e.g. ca.pem from `swapstream keys init`).")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read --trust '{path}': {e.strerror or e}. Make it readable.") from None
    from cryptography import x509

    try:
        x509.load_pem_x509_certificates(data)
    except ValueError:
        raise InputError(f"--trust '{path}' holds no PEM certificate. Give a PEM file of CA certificates "
                         f"(e.g. ca.pem from `swapstream keys init`).") from None
    return data


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
    if rep.v2_combined is not None:
        k = rep.v2_window_count
        pays = "; ".join(f"{p}: {m} windows" for p, m in rep.v2_payloads.most_common())
        t.add_row(f"v2 windows ({V2_WINDOW_S:g} s)", Text(f"{rep.v2_marked} of {k} marked" + (f", {pays}" if pays else "")))
        c = rep.v2_combined
        t.add_row("v2 all frames", Text(f"marked, {c.payload}, score {c.score:.2f}" if c.found
                                        else f"no mark ({c.reason}, score {c.score:.2f})"))
    # Every level: an HLS segment keeps the note only in its MPEG-TS service names.
    synthetic = [(k if where == "format" else f"{where}: {k}", v)
                 for where, tags in (rep.tags or {"format": rep.metadata}).items()
                 for k, v in tags.items() if _is_synthetic_tag(v)]
    t.add_row("metadata", Text("; ".join(f"{k}={v}" for k, v in synthetic)
                               if synthetic else "no synthetic-content tags"))
    if rep.c2pa is not None:
        t.add_row("c2pa", Text(_c2pa_line(rep.c2pa)))
    if rep.stopped_early:
        t.add_row("note", Text(rep.stopped_early))
    result = ("SwapStream watermark FOUND: this video was modified by SwapStream" if rep.found
              else "no SwapStream watermark found")
    if rep.declared:
        result += "; its Content Credentials (C2PA) declare it made by SwapStream"
    elif rep.c2pa is not None and rep.c2pa.verdict == "invalid":
        result += "; its Content Credentials are INVALID (changed after signing?)"
    t.add_row("result", Text(result))
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
    trust: Annotated[Optional[Path], typer.Option(
        "--trust", help="CA certificates (PEM) whose C2PA signers count as trusted, e.g. ca.pem from "
                        "`swapstream keys init`.")] = None,
) -> None:
    """Check a video for SwapStream's invisible watermark, frame by frame and in summary, and
    validate its C2PA Content Credentials (local MP4/MOV files).

    Exit status 0: a mark was found, or a C2PA manifest made by SwapStream validates; 1: neither;
    2: the input could not be read.
    """
    trust_pem = _trust(trust)
    # soft_wrap: one frame, one line, whatever the terminal's width (scripts grep these lines).
    show = None if as_json or summary_only else (lambda r: out.print(_frame_line(r), soft_wrap=True))
    show_w = None if as_json or summary_only else (lambda w: out.print(_window_line(w), soft_wrap=True))
    # Text shows each frame as it comes and keeps none; JSON keeps the first KEEP_FRAMES. The summary
    # counts every frame either way, so memory stays bounded on an endless stream.
    rep = verify(source, max_frames=max_frames, on_frame=show, keep_frames=KEEP_FRAMES if as_json else 0,
                 trust_pem=trust_pem, on_window=show_w)
    if as_json:
        typer.echo(json.dumps(rep.to_dict(), indent=2))
    else:
        _summary(rep)
    if not rep.found and not rep.declared:
        err.print(Text("no SwapStream watermark found"))
        raise typer.Exit(1)
