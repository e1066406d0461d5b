"""The `swapstream` command line."""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from . import __version__
from .config import Config, describe, load_config
from .console import err, out, run_app
from .redact import install_log_redaction, redact_url

app = typer.Typer(
    name="swapstream",
    help="Real-time face swapping in video files and live streams.\n\n"
         "Exit status: 0 done; 1 `verify` found no mark; 2 bad input, output or configuration (one "
         "`error:` line); 3 `run`'s input ended before the frames it declared (what it held was "
         "written; one `warning:` line); 130 `live` stopped with Ctrl+C.",
    add_completion=False,
    no_args_is_help=True,
    # Bad input must give one line, never a traceback: user errors are caught below, and anything
    # else is a bug whose plain traceback is more useful than a decorated one.
    pretty_exceptions_enable=False,
)
# `swapstream models list|download|verify` (engines/zoo.py, engines/download.py).
from .models_cli import app as models_app  # noqa: E402

app.add_typer(models_app, name="models")
# `swapstream engines build` (TensorRT engines, engines/tensorrt_runner.py).
from .engines_cli import app as engines_app  # noqa: E402

app.add_typer(engines_app, name="engines")
# `swapstream keys init` (C2PA test pair: keys.py, provenance.py).
from .keys_cli import app as keys_app  # noqa: E402

app.add_typer(keys_app, name="keys")


def _version(value: bool) -> None:
    if value:
        out.print(f"swapstream {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug details.")] = False,
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # Every line the CLI logs, FFmpeg's and aiohttp's included, without stream keys or tokens.
    install_log_redaction()


def _config(config: Optional[str], overrides: list[str] | None, models_dir: Optional[Path]) -> Config:
    cfg = load_config(config, overrides or [])
    if models_dir is not None:
        cfg.models_dir = models_dir
    return cfg


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("frames"), TaskProgressColumn(), TextColumn("{task.fields[fps]:.1f} fps"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=err, transient=False)


def _confirm_licence(text: str) -> bool:
    """Ask on the terminal; a non-interactive run must pass --accept-licence instead."""
    if not sys.stdin.isatty():
        return False
    err.print(Text(text))
    return typer.confirm("Accept this licence and download?", default=False, err=True)


def _download_progress() -> tuple[Progress, "object"]:
    bar = Progress(TextColumn("[bold]downloading {task.description}"), BarColumn(),
                   TaskProgressColumn(), TimeRemainingColumn(), console=err, transient=True)
    tasks: dict[str, int] = {}

    def report(name: str, done: int, total: int) -> None:
        if name not in tasks:
            bar.start()
            tasks[name] = bar.add_task(name, total=total or None)
        bar.update(tasks[name], completed=done, total=total or None)

    return bar, report


def _job_device(cfg: Config) -> str:
    """Where a command's stream runs: the first GPU when the configuration allows and one is usable,
    else the CPU; says why."""
    from .errors import ConfigError
    from .gpu import gpu_available

    if cfg.device == "cpu":
        err.print(Text("using the CPU path (device: cpu)"))
        return "cpu"
    ok, why = gpu_available()
    if ok:
        err.print(Text(f"using the GPU path: {why}"))
        return "cuda:0"
    if cfg.device == "cuda":
        raise ConfigError(f"device is 'cuda' but the GPU path cannot run: {why}. Use --set device=auto.")
    err.print(Text(f"using the CPU path: {why}"))
    return "cpu"


def _live_job_class(cfg: Config) -> "Callable[[Config], object]":
    """`live`'s job: one stream of a runtime (runtime.live), on the device `_job_device` picks (and
    says why): the first GPU (NVDEC, the GPU analysis and compose), else the CPU."""
    import functools

    from .runtime.live import LiveJob

    return functools.partial(LiveJob, device=_job_device(cfg))


def _log_disclosure(job: "object") -> None:
    """The run's log: which consent record allows the source face, what the mark says, the label."""
    _log_disclosure_of(job.consent, job.disclosure, job.provenance, job.live)  # type: ignore[attr-defined]


def _log_disclosure_of(consent: "object", disclosure: "object", provenance: "object", live: bool) -> None:
    rows = [("consent", consent.summary() if consent else "none")]  # type: ignore[attr-defined]
    rows += disclosure.describe()  # type: ignore[attr-defined]
    rows += provenance.describe(live)  # type: ignore[attr-defined]
    for name, value in rows:
        err.print(Text(f"{name}: {value}"), soft_wrap=True)


def _run_job(cfg: Config, source: Path | None, input_path: Path, output: Path, quiet: bool,
             source_image: tuple[object, str] | None = None) -> "object":
    from .runtime.run import RunJob

    device = _job_device(cfg)
    dl_bar, dl_report = _download_progress()
    try:
        job = RunJob(cfg, device=device, confirm=_confirm_licence, download_progress=None if quiet else dl_report)
    finally:
        dl_bar.stop()
    try:
        if source_image is not None:
            job.set_source_image(*source_image)  # type: ignore[arg-type]
        else:
            assert source is not None
            job.set_source(source)
        _log_disclosure(job)
        if quiet:
            stats = job.run(input_path, output)
        else:
            with _progress() as bar:
                task = bar.add_task("swapping", total=None, fps=0.0)
                t0 = time.perf_counter()

                def report(done: int, total: int) -> None:
                    el = time.perf_counter() - t0
                    bar.update(task, completed=done, total=total or None,
                               fps=done / el if el > 0 else 0.0)

                stats = job.run(input_path, output, progress=report)
    finally:
        job.close()
    return stats


SUMMARY_WIDTH = 240
"""Columns the summary may use when it does not go to a terminal: wider than any of its rows."""


def _summary(stats: "object", output: Path) -> None:
    from .runtime.run import JobStats

    assert isinstance(stats, JobStats)
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("output", Text(str(output)))
    t.add_row("frames", f"{stats.frames}")
    t.add_row("frames swapped", f"{stats.frames_swapped} ({stats.faces_swapped} face swaps)")
    t.add_row("faces found", f"{len(stats.tracks)} distinct (tracks)")
    t.add_row("audio", f"{stats.audio_packets} packets carried" if stats.audio_packets else "none")
    t.add_row("decode", {"nvdec": "NVDEC (GPU)", "pyav": "PyAV (host)"}.get(stats.decoder, stats.decoder))
    t.add_row("time", f"{stats.seconds:.2f} s")
    t.add_row("speed", f"{stats.fps:.1f} fps")
    t.add_row("device", stats.device)
    if stats.frames:
        # Where a frame's time goes, per stage (they run in threads of their own, so they overlap):
        # `queue` is its wait for the analysis, `swap-wait` for its batch.
        t.add_row("stage ms/frame", " ".join(f"{k.replace('_', '-')} {v:.2f}" for k, v in stats.step_ms().items()))
        # A frame's time from its decoding to its encoder call's end (`JobStats.latency`).
        lat = stats.latency
        t.add_row("latency ms", " ".join(f"{k} {lat.percentile_ms(q):.2f}" for k, q in
                                         (("p50", 50), ("p99", 99), ("max", 100))))
    # Into a pipe or a log (rich then assumes 80 columns, and print's own width cannot exceed the
    # console's) each row stays on one line, so that what reads it (a benchmark, grep) finds a row
    # whole; a terminal wraps at its own width.
    console = out if out.is_terminal else Console(highlight=False, width=SUMMARY_WIDTH, file=out.file)
    console.print(t)


@app.command()
def run(
    source: Annotated[Path, typer.Option("--source", "-s", help="Image with the face to put in.")],
    input: Annotated[Path, typer.Option("--input", "-i", help="Video to swap faces in.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Video file to write (.mp4, .mkv, ...); `null:` writes nothing (the frames are still swapped, labelled and marked: a run without its encoder, for timing).")],
    config: Annotated[Optional[str], typer.Option("--config", "-c",
                      help="Preset name from configs/ or a YAML file.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value "
                    "(repeatable), e.g. --set mesh.keep_eyes=true.")] = None,
    models_dir: Annotated[Optional[Path], typer.Option("--models-dir", help="Folder with model files.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    accept_licence: Annotated[bool, typer.Option("--accept-licence",
                              help="Accept zoo model licences without asking (non-interactive runs).")] = False,
) -> None:
    """Swap the face from SOURCE into every face of INPUT and write OUTPUT.

    Exit status 0: done; 2: bad input, output or configuration (one `error:` line); 3: the input
    ended before the frames it declared (a truncated file): what it held was written, and one
    `warning:` line gives the counts.
    """
    # Before the models load: a typo is known in a fraction of a second, not after seconds.
    _check_input_file("source image", source, "a PNG or JPEG file")
    _check_input_file("input", input, "a video file")
    cfg = _config(config, set_, models_dir)
    if accept_licence:
        cfg.neural.accept_licence = True
    stats = _run_job(cfg, source, input, output, quiet)
    _summary(stats, output)
    _exit_if_short(stats, input, output)


EXIT_ENDED_EARLY = 3
"""`run`'s exit status when the input ended before the frames it declared (the output holds the
frames that were there): scripts can tell a partial result from a full one (0) and from a failure (2)."""


def _exit_if_short(stats: "object", input_path: Path, output: Path) -> None:
    """One warning line and exit 3 when the input delivered fewer frames than it declared."""
    from .io.video import ended_early
    from .runtime.run import JobStats

    assert isinstance(stats, JobStats)
    expected = ended_early(stats.input_info, stats.frames) if stats.input_info is not None else None
    if expected is None:
        return
    err.print(Text(f"warning: input '{input_path}' ended early: {stats.frames} of {expected} frames "
                   f"(truncated?); wrote {stats.frames} frames to '{output}'"), soft_wrap=True)
    raise typer.Exit(EXIT_ENDED_EARLY)


def _check_input_file(what: str, path: Path, give: str, shown: str | None = None) -> None:
    """`path` (quoted as `shown`, by default itself) names an existing file, `give` being what it
    should be: checked when the command starts, because a missing input found after the models have
    loaded costs seconds (minutes for a first download) before the one-line error."""
    from .errors import InputError, InputNotFoundError

    name = str(path) if shown is None else shown
    if not path.exists():
        raise InputNotFoundError(f"{what} '{name}' does not exist. Check the path and its spelling.")
    if path.is_dir():
        raise InputError(f"{what} '{name}' is a folder. Give the path of {give}.")


def _live_input_file(url: str) -> Path | None:
    """The file a `live` input names (a path, or a file: URL read as FFmpeg's file protocol reads
    it: what follows `file:`), or None for a network stream."""
    from .live.streams import is_file_input

    if not is_file_input(url):
        return None
    return Path(url[len("file:"):] if url.lower().startswith("file:") else url)


@app.command()
def live(
    source: Annotated[Path, typer.Option("--source", "-s", help="Image with the face to put in.")],
    input: Annotated[str, typer.Option("--input", "-i", help="Live input: rtmp://HOST:PORT/APP/KEY, or a file (played once in real time).")],
    rtmp_out: Annotated[Optional[str], typer.Option("--rtmp-out", help="Push the result to this RTMP URL.")] = None,
    hls_dir: Annotated[Optional[Path], typer.Option("--hls-dir", help="Write a live HLS playlist (index.m3u8) and segments here.")] = None,
    vcam: Annotated[bool, typer.Option("--vcam", help="Send the result to a virtual camera (v4l2loopback on Linux, OBS Virtual Camera on Windows/macOS; needs swapstream[vcam]).")] = False,
    vcam_device: Annotated[Optional[str], typer.Option("--vcam-device", help="Which virtual camera, e.g. /dev/video10 (default: the first found).")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset name or YAML file.")] = "live",
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value.")] = None,
    max_frames: Annotated[Optional[int], typer.Option(min=1, help="Stop after this many frames (default: until the input ends).")] = None,
    reconnect: Annotated[float, typer.Option(min=0, help="Seconds to wait for a network input to start publishing, to reconnect a dropped input, and for a failed output to come back.")] = 60.0,
    loop: Annotated[bool, typer.Option("--loop", help="Play a file input again from the start each time it ends (stop with Ctrl+C or --max-frames).")] = False,
    no_label: Annotated[bool, typer.Option("--no-label", help="Do not draw the visible 'AI-modified' "
                        "label (logs a warning; the invisible mark stays).")] = False,
    insecure_tls: Annotated[bool, typer.Option("--insecure-tls", help=INSECURE_TLS_HELP)] = False,
) -> None:
    """Swap faces in a live stream: pull RTMP; push RTMP, write HLS and/or feed a virtual camera,
    without building up latency.

    Exit status 0: the input ended (or --max-frames); 2: bad input, output or configuration (one
    `error:` line); 130: stopped with Ctrl+C (after the summary).
    """
    # Local inputs are checked before the models load, as in `run`.
    _check_input_file("source image", source, "a PNG or JPEG file")
    local = _live_input_file(input)
    if local is not None:
        _check_input_file("live input file", local, "a video file", shown=input)
    cfg = _config(config, set_, None)
    if no_label:
        cfg.disclosure.label_live = False
    _insecure_tls(cfg, insecure_tls)
    job = _live_job_class(cfg)(cfg)
    stop = threading.Event()  # the run sets it too, as it ends
    interrupted = threading.Event()
    try:
        job.set_source(source)
        _log_disclosure(job)
        outputs = [x for x in (redact_url(rtmp_out) if rtmp_out else None, str(hls_dir) if hls_dir else None,
                               (vcam_device or "virtual camera") if vcam else None) if x]
        err.print(Text(f"live: {redact_url(input)} -> {', '.join(outputs)}"))  # no stream keys on screen

        def waiting() -> None:
            # Start SwapStream first, then OBS (docs/obs.md): say what it waits for, once.
            err.print(Text(f"waiting for {redact_url(input)} (publish from OBS now)"), soft_wrap=True)

        with _stop_on_sigint(stop, interrupted):
            stats = job.run_live(input, rtmp_out=rtmp_out, hls_dir=hls_dir, max_frames=max_frames,
                                 reconnect_seconds=reconnect, vcam=vcam, vcam_device=vcam_device,
                                 loop=loop, stop=stop, on_wait=waiting)
    finally:
        job.close()
    _live_summary(stats)
    if interrupted.is_set():
        raise typer.Exit(130)  # stopped by Ctrl+C: the shell's code for SIGINT, after the summary


@contextlib.contextmanager
def _stop_on_sigint(stop: threading.Event, interrupted: threading.Event) -> Iterator[None]:
    """Ctrl+C sets `stop` (and `interrupted`) instead of raising in the middle of a write: the live
    run then ends as at its normal end (outputs flushed and closed) and its summary is printed. A
    second Ctrl+C, for a run that does not stop, interrupts at once."""
    def on_sigint(signum: int, frame: object) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread (a test calling the command in a thread)
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _live_summary(stats: "object") -> None:
    """The line a live run ends with, at its end and after Ctrl+C alike. Latency: from a frame's
    arrival (decoded, or its access unit read) to the end of its output call (x264 included)."""
    from .runtime.live import LiveStats

    assert isinstance(stats, LiveStats)
    lat = sorted(stats.latency_ms)
    p50 = lat[len(lat) // 2] if lat else 0.0
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0
    out.print(Text(f"frames in {stats.frames_in}, out {stats.frames_out}, dropped {stats.dropped}, "
                   f"faces swapped {stats.faces_swapped}, audio packets {stats.audio_packets}, "
                   f"reconnects {stats.reconnects}, latency p50 {p50:.0f} ms, p99 {p99:.0f} ms; "
                   f"dropped while starting {stats.dropped_at_start}; on {stats.device or '?'}, "
                   f"NVDEC frames {stats.nvdec_frames}"), soft_wrap=True)


@app.command()
def serve(
    source: Annotated[Optional[Path], typer.Option(
        "--source", "-s", help="Image with the face WHIP publishers get (needed unless --no-webrtc); API streams "
                                     "start with it too, until a face is uploaded for them.")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; one other than loopback needs --whip-token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port for WHIP (POST /whip).")] = 8080,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset name or YAML file.")] = "live",
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value.")] = None,
    no_label: Annotated[bool, typer.Option("--no-label", help="Do not draw the visible 'AI-modified' "
                        "label (logs a warning; the invisible mark stays).")] = False,
    api_token: Annotated[Optional[str], typer.Option("--api-token", envvar="SWAPSTREAM_API_TOKEN",
                         help="Bearer token of the stream control API (default: a random one, printed). "
                              "On the command line it shows in ps: prefer SWAPSTREAM_API_TOKEN or "
                              "--api-token-file.")] = None,
    api_token_file: Annotated[Optional[Path], typer.Option(
        "--api-token-file", envvar="SWAPSTREAM_API_TOKEN_FILE",
        help="Read the control API's bearer token from this file (its first line).")] = None,
    hls_root: Annotated[Optional[Path], typer.Option("--hls-root", help="Folder for the HLS outputs of API streams.")] = None,
    media_root: Annotated[Optional[Path], typer.Option("--media-root", help="Folder whose files API streams may use as inputs.")] = None,
    whip_token: Annotated[Optional[str], typer.Option(
        "--whip-token", envvar="SWAPSTREAM_WHIP_TOKEN",
        help="Require 'Authorization: Bearer TOKEN' on /whip and /whep (OBS: the WHIP Bearer Token "
             "field); needed with a --host other than loopback. The preview pages send the one in "
             "their URL: /view?token=TOKEN. On the command line it shows in ps: prefer "
             "SWAPSTREAM_WHIP_TOKEN or --whip-token-file.")] = None,
    whip_token_file: Annotated[Optional[Path], typer.Option(
        "--whip-token-file", envvar="SWAPSTREAM_WHIP_TOKEN_FILE",
        help="Read the WHIP/WHEP bearer token from this file (its first line).")] = None,
    max_sessions: Annotated[int, typer.Option(
        "--max-sessions", min=1, help="Most WHIP publishers (and, separately, WHEP viewers) at once.")] = 16,
    insecure_tls: Annotated[bool, typer.Option("--insecure-tls", help=INSECURE_TLS_HELP)] = False,
    workers: Annotated[int, typer.Option(
        "--workers", min=0, max=64,
        help="Worker processes per GPU (or on the CPU, when there is none) that run the API's streams "
             "and the WHIP publishers, behind this one server; a worker that dies has its API streams "
             "started again on the others (its publishers reconnect). 0: the streams run in this process.")] = 0,
    no_webrtc: Annotated[bool, typer.Option(
        "--no-webrtc", help="Serve the stream API alone: no WHIP/WHEP endpoints and no models loaded "
                            "for them (an RTMP/HLS-only server).")] = False,
    mps: Annotated[Optional[bool], typer.Option(
        "--mps/--no-mps",
        help="Run each GPU's workers as clients of an NVIDIA MPS daemon that serve starts and stops, so "
             "their kernels share the GPU at once (default: on with 2 or more workers on a GPU).")] = None,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", metavar="ADDRESS",
        help="Run the API's streams on a Ray cluster (HOST:PORT of its head, or auto on one of its "
             "nodes): --workers N worker actors spread over its nodes, placed and failed over by this "
             "server, restarted by Ray (docs/scale.md). Needs swapstream[cluster].")] = None,
    ray_gpus: Annotated[float, typer.Option(
        "--ray-gpus", min=0.0, max=1.0,
        help="With --ray: the share of a GPU each worker actor asks for (0.25: four workers per GPU, "
             "which share it under the node's MPS daemon).")] = 0.25,
    ray_resource: Annotated[Optional[str], typer.Option(
        "--ray-resource", metavar="NAME=AMOUNT",
        help="With --ray: ask for this custom Ray resource per worker instead of a GPU share (GPU slots "
             "on CPU-only nodes, e.g. nodes started with --resources '{\"swapstream_slot\": 2}').")] = None,
    ray_cpus: Annotated[float, typer.Option(
        "--ray-cpus", min=0.0, help="With --ray: the CPUs each worker actor asks for (decoding, encoding).")] = 1.0,
) -> None:
    """Serve WebRTC: a WHIP endpoint (OBS 30+, browsers) whose publisher gets the swapped video back;
    and the multi-stream runtime: control API (/api/streams), /metrics, /dashboard (docs/runtime.md)."""
    from aiohttp import web

    from .errors import ConfigError

    api_token = _token(api_token, api_token_file, "--api-token", "SWAPSTREAM_API_TOKEN")
    _check_serve_folders(hls_root, media_root)  # before the models load: bad paths fail at once
    cluster = _ray_options(ray, workers, mps, ray_gpus, ray_resource, ray_cpus)  # and the cluster answers
    if source is not None:
        _check_input_file("source image", source, "a PNG or JPEG file")
    cfg = _config(config, set_, None)
    if no_label:
        cfg.disclosure.label_live = False
    _insecure_tls(cfg, insecure_tls)
    if no_webrtc:
        app_ = web.Application()
        _mount_runtime(app_, cfg, api_token, hls_root, media_root, f"http://{host}:{port}",
                       workers=workers, mps=mps, source=source, cluster=cluster)
        _run_app(app_, host, port)
        return
    if source is None:
        raise ConfigError("serve needs --source FACE.jpg: the face WHIP publishers get (or --no-webrtc "
                          "for the stream API alone)")
    from .live.webrtc import WhipServer, require_whip_token
    from .runtime.manager import StreamRuntime
    from .runtime.rtc import RuntimePublishers

    whip_token = _token(whip_token, whip_token_file, "--whip-token", "SWAPSTREAM_WHIP_TOKEN")
    require_whip_token(host, whip_token)  # before the models load, as the folders
    image = _check_serve_source(cfg, source)
    base = f"http://{host}:{port}"
    # WHIP publishers are streams of the runtime, as the API's are (runtime.rtc): with workers, each
    # placed on a worker like an API stream (runtime.whip_relay); else of the API's own runtime, in
    # this process (or, with --ray, of a runtime in this process beside the cluster's workers).
    whip = {"max_sessions": max_sessions}  # the workers' publishers take serve's config, as they are given it
    pool = _worker_pool(cfg, workers, mps, hls_root, media_root, source, whip) if workers and not cluster else None
    runtime = None
    if pool is not None:
        from .runtime.whip_relay import PoolRelay

        server = WhipServer(None, relay=PoolRelay(pool, cfg.swapper), token=whip_token,
                            max_sessions=max_sessions, settings=cfg.webrtc, host=host)
    else:
        runtime = StreamRuntime(cfg)
        media = RuntimePublishers(runtime, image=image, image_name=f"the server's source image '{source}'",
                                  image_path=source)
        server = WhipServer(media, token=whip_token, max_sessions=max_sessions, settings=cfg.webrtc, host=host)
    for line in (f"WHIP endpoint: {base}/whip  (OBS: Settings > Stream > Service WHIP)",
                 f"WHEP endpoint: {base}/whep  browser preview: {base}/",
                 f"view for an OBS Browser Source: {base}/view?bg=transparent  (or ?bg=chroma&color=00ff00)"):
        err.print(Text(line), soft_wrap=True)  # URLs unbroken, to copy into OBS
    in_process = _mount_runtime(server.app, cfg, api_token, hls_root, media_root, base, workers=workers,
                                mps=mps, source=source, cluster=cluster, runtime=runtime, pool=pool)
    if runtime is not None and not in_process:
        from .runtime.api import tie_runtime

        tie_runtime(server.app, runtime)
        err.print(Text(f"WHIP publishers run in this process on {', '.join(s.name for s in runtime.slots)}, "
                       f"beside the cluster's workers"), soft_wrap=True)
    elif pool is not None:
        err.print(Text("WHIP publishers are placed on the workers, each a stream there"), soft_wrap=True)
    _run_app(server.app, host, port)


def _worker_pool(cfg: Config, workers: int, mps: Optional[bool], hls_root: Optional[Path],
                 media_root: Optional[Path], source: Optional[Path],
                 whip: Optional[dict[str, object]] = None) -> "object":
    """serve --workers N: the pool of worker processes per device (runtime.workers), with one MPS
    daemon per GPU by default with 2 or more workers there. `whip`: WHIP and WHEP in the workers."""
    from .errors import ConfigError
    from .runtime.manager import default_devices
    from .runtime.metrics import GpuMonitor
    from .runtime.workers import WorkerPool

    monitor = GpuMonitor()
    devices = default_devices(monitor, cfg.device)
    monitor.close()
    on_gpu = devices != ["cpu"]
    use_mps = (workers >= 2 and on_gpu) if mps is None else mps
    if use_mps and not on_gpu:
        raise ConfigError("--mps needs an NVIDIA GPU, and none is usable here: leave --mps out")
    pool = WorkerPool(cfg, devices=devices, per_device=workers, hls_root=hls_root, media_root=media_root,
                      mps=use_mps, default_source=source, whip=whip)
    err.print(Text(f"{workers} worker process(es) on each of {', '.join(devices)}"
                   + (" under MPS" if use_mps else "")))
    return pool


def _check_serve_source(cfg: Config, source: Path) -> "object":
    """serve's face, read and checked at start as a job checks its source (a face in it, a consent
    record for it), so that a bad one is one error line rather than a failure at each publisher.
    Logs the consent record, the mark and the label as a job does. Returns the image (RGB)."""
    from .disclosure import Disclosure
    from .io.image import load_image
    from .provenance import Provenance
    from .runtime.live import check_source

    image = load_image(source)
    consent = check_source(cfg, image, str(source), source)
    _log_disclosure_of(consent, Disclosure(cfg, live=True), Provenance(cfg.provenance), True)
    return image


def _run_app(app_: object, host: str, port: int) -> None:
    from aiohttp import web

    from .runtime.api import RedactingAccessLogger

    assert isinstance(app_, web.Application)
    app_.on_shutdown.insert(0, _finish_stopping)
    try:
        # The access log (with -v) without ?token= queries, tokens in Referers or HLS view keys.
        web.run_app(app_, host=host, port=port, print=None, access_log_class=RedactingAccessLogger)  # type: ignore[arg-type]
    except OSError as e:
        raise _listen_error(e, host, port) from None


async def _finish_stopping(_app: object) -> None:
    """Once serve stops, a second Ctrl+C or a SIGTERM after the SIGINT (a supervisor's, a script's
    time limit) is logged, not raised: raised, it broke off the cleanup that stops the streams and
    the workers, whose sessions and pipes were left open (every one a traceback as the loop closed).
    That cleanup is bounded: each worker has WORKER_STOP_S to stop, each stream its own timeouts."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, logging.getLogger("swapstream").warning,
                                    "already stopping: the streams and workers are finishing")
        except (NotImplementedError, RuntimeError):  # no signal handlers here (Windows, a thread)
            pass


INSECURE_TLS_HELP = ("Do not verify rtmps:// servers' certificates (a lab server with a self-signed "
                     "one); logged as a warning. Better: give its CA with SSL_CERT_FILE or "
                     "--set runtime.tls_ca_file=PATH.")


def _insecure_tls(cfg: Config, flag: bool) -> None:
    """--insecure-tls: rtmps:// without certificate checks (runtime.insecure_tls), said in the log."""
    if flag:
        cfg.runtime.insecure_tls = True
    if cfg.runtime.insecure_tls:
        logging.getLogger("swapstream").warning(
            "--insecure-tls (runtime.insecure_tls): rtmps:// certificates are not verified; whoever "
            "is on the path can read the stream keys")


def _listen_error(e: OSError, host: str, port: int) -> Exception:
    """The user error for an address that cannot be listened on; any other OSError as it was."""
    import errno
    import socket

    from .errors import ConfigError

    where = f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return ConfigError(f"cannot listen on {where}: the port is already in use. Stop what uses it, "
                           f"or choose another with --port")
    if e.errno == errno.EACCES:
        return ConfigError(f"cannot listen on {where}: permission denied (ports below 1024 need "
                           f"privileges). Choose another with --port, e.g. --port 8080")
    if e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
        return ConfigError(f"cannot listen on {where}: {host!r} is not an address of this machine. "
                           f"Give one with --host (127.0.0.1, or 0.0.0.0 for all), or another --port")
    return e


def _token(value: Optional[str], file: Optional[Path], option: str, env: str) -> Optional[str]:
    """A bearer token from `option`-file, or from `option` / `env`; None when neither is given.

    A token on the command line is readable by every user of the machine (ps, /proc/PID/cmdline):
    it still works, with a warning that names the two ways that do not show."""
    from .errors import ConfigError

    if file is not None:
        if value is not None:
            raise ConfigError(f"both {option}-file and {option} (or {env}) are given: keep one")
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else "not UTF-8 text"
            raise ConfigError(f"cannot read {option}-file '{file}': {why}. Give a readable file whose "
                              f"first line is the token") from None
        value = lines[0].strip() if lines else ""
        if not value:
            raise ConfigError(f"{option}-file '{file}' is empty: put the token on its first line")
    elif value is not None and any(a == option or a.startswith(option + "=") for a in sys.argv[1:]):
        err.print(Text(f"warning: {option} on the command line is visible to every user of this "
                       f"machine (ps); set {env} or use {option}-file instead"), soft_wrap=True)
    if value is not None and not re.fullmatch(r"[\x21-\x7e]+", value):
        raise ConfigError(f"the token of {option} must be printable ASCII without spaces (it travels in "
                          f"an HTTP header): use a random string such as the output of "
                          f"`python -c 'import secrets; print(secrets.token_urlsafe(24))'`")
    return value


def _check_serve_folders(hls_root: Optional[Path], media_root: Optional[Path]) -> None:
    """--media-root must be an existing folder (it is read); --hls-root a folder that can be written,
    made now if missing, rather than an API stream failing later."""
    import tempfile

    from .errors import InputNotFoundError, OutputError

    if media_root is not None and not media_root.is_dir():
        raise InputNotFoundError(f"--media-root '{media_root}' is not a folder. Give an existing folder.")
    if hls_root is None:
        return
    if hls_root.exists() and not hls_root.is_dir():
        raise OutputError(f"--hls-root '{hls_root}' is a file, not a folder. Give a folder (it is made "
                          f"if missing).")
    try:
        hls_root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=hls_root).close()  # the real test of writing, for root and RO mounts
    except OSError as e:
        raise OutputError(f"--hls-root '{hls_root}' cannot be written: {e.strerror or e}. Give a folder "
                          f"you can write.") from None


def _ray_options(address: Optional[str], workers: int, mps: Optional[bool], gpus: float,
                 resource: Optional[str], cpus: float) -> Optional[dict[str, object]]:
    """serve --ray: the options checked and the cluster joined (one line and exit 2 when it does not
    answer), or None without --ray."""
    from .errors import ConfigError

    if address is None:
        if resource is not None:
            raise ConfigError("--ray-resource is for --ray: give the cluster's address with --ray HOST:PORT")
        return None
    if workers < 1:
        raise ConfigError("--ray runs the streams on worker actors: give how many with --workers N (e.g. 4 "
                          "per GPU of the cluster)")
    if mps:
        raise ConfigError("--mps starts a daemon on this machine only: under --ray each GPU node runs its "
                          "own MPS daemon (deploy/kuberay does); leave --mps out")
    asked: tuple[str, float] | None = None
    if resource is not None:
        name, sep, amount = resource.partition("=")
        try:
            value = float(amount) if sep else 1.0
        except ValueError:
            value = -1.0
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", name) or not value > 0:
            raise ConfigError(f"--ray-resource {resource!r}: give NAME=AMOUNT with a resource name of "
                              f"letters, digits and _ and an amount above 0, e.g. swapstream_slot=1")
        asked = (name, value)
    elif gpus <= 0:
        raise ConfigError("--ray-gpus 0 asks for no GPU: give a share such as 0.25, or --ray-resource "
                          "NAME=AMOUNT for CPU-only nodes")
    from .runtime.cluster import connect_ray

    connect_ray(address)
    return {"address": address, "gpus": gpus, "resource": asked, "cpus": cpus}


def _mount_runtime(app_: object, cfg: Config, token: Optional[str], hls_root: Optional[Path],
                   media_root: Optional[Path], base: str, *, workers: int = 0,
                   mps: Optional[bool] = None, source: Optional[Path] = None,
                   cluster: Optional[dict[str, object]] = None, runtime: object = None,
                   pool: object = None) -> bool:
    """The multi-stream runtime and its control API on the serve app (swapstream.runtime): in this
    process, or with `workers` worker processes per device behind it (runtime.workers). The folders
    were checked by `_check_serve_folders`. `source` (serve -s): the face API streams start with.
    `runtime`: the runtime to serve when the streams run in this process (default: a new one);
    `pool`: the worker pool with `workers` (default: a new one). Returns whether they run here."""
    from .runtime.api import ApiSettings, mount_runtime, new_token
    from .runtime.manager import StreamRuntime

    chosen = token or new_token()
    if cluster is not None:
        from .runtime.cluster import RayWorkerPool
        from .runtime.pool_api import mount_pool

        ApiSettings(chosen, default_source=source)  # the token's and image's checks, as in one process
        resource = cluster["resource"]
        mount_pool(app_, RayWorkerPool(cfg, workers=workers, gpus=float(cluster["gpus"]),  # type: ignore[arg-type]
                                       resource=resource, cpus=float(cluster["cpus"]),  # type: ignore[arg-type]
                                       hls_root=hls_root, media_root=media_root, default_source=source),
                   chosen, cfg.runtime.upload_max_bytes)
        asks = f"{resource[1]:g} {resource[0]}" if resource else f"{cluster['gpus']:g} GPU"  # type: ignore[index]
        err.print(Text(f"{workers} worker actor(s) on the Ray cluster at {cluster['address']}, each asking "
                       f"for {asks}"))
    elif workers:
        from .runtime.pool_api import mount_pool

        ApiSettings(chosen, default_source=source)  # the token's and image's checks, as in one process
        mount_pool(app_, pool or _worker_pool(cfg, workers, mps, hls_root, media_root, source),  # type: ignore[arg-type]
                   chosen, cfg.runtime.upload_max_bytes)
    else:
        mount_runtime(app_, runtime or StreamRuntime(cfg),  # type: ignore[arg-type]
                      ApiSettings(chosen, hls_root=hls_root, media_root=media_root, default_source=source))
    err.print(Text(f"stream API: {base}/api/streams  dashboard: {base}/dashboard  metrics: {base}/metrics"))
    if token is None:
        # Printed once, on the terminal that started the server; set SWAPSTREAM_API_TOKEN to choose it.
        err.print(Text(f"API token: {chosen}"))
    return cluster is None and not workers


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where to write demo.mp4 and the contact sheet.")] = Path("out"),
    seconds: Annotated[float, typer.Option(min=0.5, max=60, help="Length of the demo clip.")] = 4.0,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset name or YAML file.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Swap a built-in public-domain face onto a built-in animated clip, offline."""
    from .demo import astronaut, contact_sheet, grace_hopper, write_demo_clip

    # The demo shows the visible label too (file runs leave it off by default); --set can still
    # turn it off, since later overrides win.
    cfg = _config(config, ["disclosure.label_files=true", *(set_ or [])], None)
    target_clip = out_dir / "demo_target.mp4"
    result = out_dir / "demo.mp4"
    sheet = out_dir / "demo_contact_sheet.png"
    err.print(Text(f"making the target clip {target_clip} (Grace Hopper, animated, with a tone)"))
    write_demo_clip(target_clip, grace_hopper(), seconds=seconds)
    err.print("swapping in the astronaut portrait (Eileen Collins)")
    stats = _run_job(cfg, None, target_clip, result, quiet,
                     source_image=(astronaut(), "built-in astronaut portrait"))
    contact_sheet(target_clip, result, sheet)
    _summary(stats, result)
    out.print(Text(f"contact sheet: {sheet}"))


@app.command()
def setup(
    models_dir: Annotated[Optional[Path], typer.Option("--models-dir", help="Where to put the models.")] = None,
    wheel: Annotated[Optional[Path], typer.Option("--wheel", help="A local mediapipe-0.10.21 wheel, for offline machines.")] = None,
) -> None:
    """Install the built-in face models (once; needs PyPI unless --wheel is given)."""
    from .engines.builtin import LICENCE, install_builtin_models

    err.print(f"built-in face models: MediaPipe BlazeFace and Face Mesh, licence {LICENCE}")
    paths = install_builtin_models(models_dir, wheel, report=lambda m: err.print(Text(m)))
    for p in paths:
        out.print(Text(f"ok  {p}"))


@app.command("config")
def config_cmd(
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="Preset name or YAML file.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: key=value.")] = None,
) -> None:
    """Print every config key with its effective value and what it does."""
    cfg = load_config(config, set_ or [])
    data = cfg.model_dump()
    t = Table("key", "value", "meaning")
    for key, _default, doc in describe():
        node: object = data
        for part in key.split("."):
            node = node[part]  # type: ignore[index]
        t.add_row(key, Text(repr(node)), doc)
    out.print(t)


# `swapstream consent add|list|remove|check` and `swapstream verify` (responsible use: consent.py,
# watermark.py, verify.py).
from .consent_cli import app as consent_app  # noqa: E402
from .verify_cli import verify_command  # noqa: E402

app.add_typer(consent_app, name="consent")
app.command("verify")(verify_command)


def main() -> None:
    """Entry point of the `swapstream` command."""
    run_app(app)


if __name__ == "__main__":
    main()
