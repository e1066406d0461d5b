"""Live latency, frame by frame: RTMP -> swap -> RTMP, and the WebRTC round trip (WHIP publisher ->
swap -> back to the publisher), on real peers over loopback.

    python tools/bench_live.py [--seconds 12] [--size 640x360] [--fps 15] [--config live]
                               [--only rtmp|webrtc] [--out docs/benchmarks]

Every source frame carries its number (`tests/helpers/probe.py`); a frame's latency is the time from
when the publisher handed it to its encoder to when the frame with that number reached the viewer,
so encoding at both ends, both network hops, the server's demuxing and decoding, the swap and the
player's decoding are all in it; only capture and display are not. The first `--warmup` seconds
(connection set-up, first keyframes, probing) are left out.

- RTMP: a PyAV publisher (x264 `zerolatency`, AAC) pushes to a real nginx-rtmp; `swapstream live`
  (started as a user starts it) pulls, swaps and pushes back under another key; a PyAV player
  pulls that and decodes.
- WebRTC: an aiortc publisher sends video and a tone over WHIP to `swapstream serve` (started as a
  user starts it; its publisher's video is a stream of its runtime) and receives the swapped video
  and the audio back on the same connection. The audio's offset from the video is measured too.

The server side (the live job; `swapstream serve`) runs in a process of its own, as `swapstream
live` and `serve` do; the publisher and the player share this one. (In one process, the peers'
Python work competed with the server's for the interpreter: the GPU swap's host time doubled.)

Writes `live_latency.json` (records as docs/performance.md, "Benchmark records", describes) and
`live_latency.md` into --out. With --only, the other path's records already in the JSON are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The measurement helpers (stamped media, timed receivers, latency measures) are test helpers, kept
# out of the package in tests/helpers/: put the repository root on the path so that `tests` imports
# when this runs as `python tools/bench_live.py`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import av  # noqa: E402
import numpy as np  # noqa: E402

from swapstream.config import load_config  # noqa: E402
from swapstream.errors import SwapStreamError  # noqa: E402
from swapstream.live.nginx import NginxRtmp, find_nginx_rtmp  # noqa: E402
from swapstream.live.streams import rtmp_input_options  # noqa: E402
from tests.helpers.publisher import publish_rtmp  # noqa: E402
from tests.helpers.probe import (ProbeClock, Received, StampedClip,  # noqa: E402
                                 StampedVideoTrack, ToneTrack, audio_lag, read_stamp, receive, tone,
                                 tone_edges, unwrap, video_lag)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_name, gpu_name, interrupt, run_fields, source_image, wait_ready  # noqa: E402



def gpu_and_cpu() -> str:
    """The GPU's name and the CPU's (both do work on the GPU path: x264 runs on the CPU)."""
    return f"{gpu_name()} with {cpu_name()}"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# --------------------------------------------------------------------------------------------------
# RTMP -> swap -> RTMP


LIVE_SUMMARY = re.compile(r"frames in (\d+), out (\d+), dropped (\d+), .*latency p50 (\d+) ms, p99 (\d+) ms; "
                          r"dropped while starting (\d+); on (\S+), NVDEC frames (\d+)")


def start_live(config: str, gpu: bool, in_url: str, out_url: str, folder: Path) -> Any:
    """`swapstream live` as a user starts it, in a process of its own, its output to a log file."""
    import subprocess

    args = [sys.executable, "-m", "swapstream.cli", "live", "-s", str(source_image(folder)), "-i", in_url,
            "--rtmp-out", out_url, "--reconnect", "10", "--config", config]
    if not gpu:
        args += ["--set", "device=cpu"]
    log = (folder / "live.log").open("w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), folder / "live.log"


def stop_live(proc: Any, log: Path) -> dict[str, Any]:
    """Ctrl+C, as a user ends it; its summary line's figures."""
    interrupt(proc)
    text = " ".join(log.read_text().split())  # the summary line may be wrapped
    m = LIVE_SUMMARY.search(text)
    if m is None:
        raise RuntimeError(f"swapstream live gave no summary (exit {proc.returncode}): {text[-3000:]}")
    f_in, f_out, dropped, p50, p99, at_start, device, nvdec = m.groups()
    return {"dropped": int(dropped) - int(at_start), "dropped_at_start": int(at_start),
            "swap_ms": float(p50), "swap_p99_ms": float(p99), "device": device, "nvdec_frames": int(nvdec)}


def bench_rtmp(config: str, size: tuple[int, int], fps: float, seconds: float,
               warmup: float, gpu: bool = False, interleaved: bool = False) -> dict[str, Any]:
    clip = StampedClip(size=size, fps=fps)
    sent: dict[int, float] = {}
    got: list[tuple[int, float]] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp, NginxRtmp(Path(tmp) / "nginx") as nginx:
        pub = threading.Thread(target=publish_rtmp, args=(nginx.url("in"), clip, sent, stop),
                               kwargs={"interleaved": interleaved, "audio": tone}, name="publisher")
        pub.start()
        # The job's first connection must find a stream (later ones reconnect): wait until the
        # publisher has sent half a second.
        deadline = time.monotonic() + 10
        while len(sent) < fps / 2:
            if time.monotonic() > deadline or not pub.is_alive():
                stop.set()
                raise RuntimeError("the RTMP publisher did not start")
            time.sleep(0.05)
        server, log = start_live(config, gpu, nginx.url("in"), nginx.url("out"), Path(tmp))
        # The player: from its first frame, `warmup` then `seconds` of frames (the job's start,
        # its models and warm-up, can take a minute on a fresh machine).
        give_up, end = time.monotonic() + 120, float("inf")
        while time.monotonic() < min(give_up, end) and pub.is_alive() and server.poll() is None:
            try:
                with av.open(nginx.url("out"), options=rtmp_input_options(), timeout=(5, 3)) as c:
                    for f in c.decode(video=0):
                        got.append((read_stamp(f.to_ndarray(format="rgb24")), time.monotonic()))
                        end = min(end, got[0][1] + warmup + seconds)
                        if got[-1][1] > end:
                            break
            except (av.error.FFmpegError, OSError):
                time.sleep(0.2)  # the output is not published yet: try again
        stats = stop_live(server, log)
        stop.set()
        pub.join(timeout=10)
    if not got:
        raise RuntimeError("no frame came out of the RTMP path")
    start = got[0][1] + warmup
    numbers = sorted(sent)
    lat = []
    for n8, t in got:
        cand = [n for n in numbers if n % 256 == n8 and sent[n] <= t]
        if cand and t >= start:
            lat.append((t - sent[cand[-1]]) * 1e3)
    return {"latency_ms": lat, "frames_sent": len(sent), "frames_back": len(got), **stats}


# --------------------------------------------------------------------------------------------------
# WebRTC round trip


class Serve:
    """`swapstream serve` as a user starts it, in a process of its own: the WHIP endpoint, and the
    control API whose stream list shows each publisher's runtime stream."""

    def __init__(self, config: str, gpu: bool, workdir: Path) -> None:
        import subprocess

        from swapstream.live.nginx import free_port

        face = source_image(workdir)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.token = "bench-live-" + os.urandom(12).hex()
        args = [sys.executable, "-m", "swapstream.cli", "serve", "-s", str(face), "--port", str(self.port),
                "--config", config]
        if not gpu:
            args += ["--set", "device=cpu"]
        self.log = workdir / "serve.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "SWAPSTREAM_API_TOKEN": self.token})

    async def ready(self, timeout: float = 240) -> None:
        """Until /readyz answers 200 (models loaded, the runtime warmed up): minutes on a cold GPU."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, wait_ready, self.base, self.proc, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {self.tail()}") from None

    async def whip_streams(self, http: Any) -> list[dict[str, Any]]:
        async with http.get(self.base + "/api/streams",
                            headers={"Authorization": f"Bearer {self.token}"}) as r:
            body = await r.json()
        return [s for s in body["streams"] if s["id"].startswith("whip-")]

    def tail(self) -> str:
        self._log.flush()
        return self.log.read_text()[-3000:]

    def stop(self) -> None:
        interrupt(self.proc, timeout=30)
        self._log.close()


async def bench_webrtc(config: str, size: tuple[int, int], fps: float, seconds: float,
                       warmup: float, gpu: bool = False) -> dict[str, Any]:
    from aiohttp import ClientSession

    with tempfile.TemporaryDirectory() as tmp:
        serve = Serve(config, gpu, Path(tmp))
        try:
            async with ClientSession() as http:
                await serve.ready()
                res = await webrtc_round_trip(serve, http, size, fps, seconds, warmup)
        finally:
            serve.stop()
    print(f"  swapstream serve: the publisher's video a stream of its runtime on {res['device']}", flush=True)
    return res


async def webrtc_round_trip(serve: Serve, http: Any, size: tuple[int, int], fps: float, seconds: float,
                            warmup: float) -> dict[str, Any]:
    """One aiortc publisher through `serve`'s WHIP endpoint, measured at the publisher; the server's
    own figures for its stream from the control API just before the publisher leaves."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from swapstream.live.webrtc import AIORTC_AUDIO_PREFETCH_S, first_codec

    loop = asyncio.get_running_loop()
    clock = ProbeClock(loop.time())
    video = StampedVideoTrack(clock, size=size, fps=fps)
    back = Received()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: aiortc's default is Google's
    pc.addTransceiver(video, direction="sendrecv")
    pc.addTransceiver(ToneTrack(clock), direction="sendrecv")
    pc.on("track", lambda track: asyncio.ensure_future(receive(track, back, keep_pixels=False)))
    await pc.setLocalDescription(await pc.createOffer())
    try:
        r = await http.post(serve.base + "/whip", data=pc.localDescription.sdp,
                            headers={"Content-Type": "application/sdp"})
        if r.status != 201:
            raise RuntimeError(f"WHIP answered {r.status}: {await r.text()}")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=await r.text(), type="answer"))
        give_up = loop.time() + 30
        while not back.video:
            if loop.time() > give_up:
                raise RuntimeError(f"no frame came back over WebRTC: {serve.tail()}")
            await asyncio.sleep(0.05)
        first = back.video[0][2]
        await asyncio.sleep(warmup + seconds)  # the measurement window, from the first frame back
        streams = await serve.whip_streams(http)
        await http.delete(serve.base + r.headers["Location"])
    finally:
        answer = pc.remoteDescription.sdp if pc.remoteDescription else ""
        await pc.close()
    if len(streams) != 1:
        raise RuntimeError(f"expected one WHIP stream in the server's stream list, got {streams}")
    info = streams[0]
    codec = first_codec(answer) or "?"
    start = first + warmup
    frames = [(n, handed, reached) for n, handed, reached in unwrap(back.video, video.sent)
              if reached >= start]
    lat = [(reached - video.sent[n]) * 1e3 for n, _h, reached in frames]
    handed = [(h - video.sent[n]) * 1e3 for n, h, _r in frames]
    v = [x for x, (_n, _h, reached) in zip(video_lag(back.video, clock, fps, video.sent),
                                            unwrap(back.video, video.sent)) if reached >= start]
    a = [x - AIORTC_AUDIO_PREFETCH_S for x, t in zip(audio_lag(tone_edges(back.audio), clock),
                                                     tone_edges(back.audio)) if t >= start]
    window = info["latency_window_ms"]  # the stream's last 10 s, inside the measured window
    drops = info["dropped"]
    return {"latency_ms": lat, "handover_ms": handed, "frames_sent": len(video.sent),
            "frames_back": len(back.video),
            "dropped": drops["input"] + drops["swap"] + drops["encode"],
            "swap_ms": window["p50"], "swap_p99_ms": window["p99"],
            "nvdec_frames": info.get("nvdec_frames", 0), "video_codec": codec,
            "server_level": info["level"], "device": info["device"],
            "av_offset_ms": (statistics.median(a) - statistics.median(v)) * 1e3 if a and v else None}


# --------------------------------------------------------------------------------------------------


def records_for(path: str, res: dict[str, Any], common: dict[str, Any], size: str) -> list[dict[str, Any]]:
    out = []

    def add(metric: str, value: float | None, unit: str, stat: str) -> None:
        if value is not None and not np.isnan(value):
            out.append({"metric": metric, "value": round(float(value), 1), "unit": unit, "stat": stat,
                        **common})

    lat = res["latency_ms"]
    name = {"rtmp": f"rtmp_to_rtmp_latency_{size}", "webrtc": f"webrtc_roundtrip_latency_{size}"}[path]
    add(name, percentile(lat, 50), "ms", "p50")
    add(name, percentile(lat, 99), "ms", "p99")
    add(name, max(lat) if lat else None, "ms", "max")
    if path == "webrtc":
        # What an aiortc player sees: it hands a frame over one frame interval late (probe.unwrap).
        add(f"webrtc_roundtrip_latency_aiortc_handover_{size}", percentile(res["handover_ms"], 50), "ms", "p50")
        add(f"webrtc_audio_minus_video_offset_{size}", res["av_offset_ms"], "ms", "p50")
    add(f"{path}_swap_stage_{size}", res["swap_ms"], "ms", "p50")
    add(f"{path}_swap_stage_{size}", res.get("swap_p99_ms"), "ms", "p99")
    add(f"{path}_frames_measured_{size}", len(lat), "frames", "count")
    add(f"{path}_frames_dropped_{size}", res["dropped"], "frames", "count")
    add(f"{path}_frames_dropped_at_start_{size}", res.get("dropped_at_start"), "frames", "count")
    add(f"{path}_frames_decoded_on_nvdec_{size}", res.get("nvdec_frames", 0), "frames", "count")
    for r in out:
        if path == "webrtc":
            r["config"] = {**r["config"], "video_codec": res.get("video_codec")}
    return out


BEGIN, END = "<!-- tools/bench_live.py: begin -->", "<!-- tools/bench_live.py: end -->"
"""The part of live_latency.md this tool writes; the rest of the file is kept as it is."""


def write_markdown(path: Path, records: list[dict[str, Any]]) -> None:
    block = "\n".join([BEGIN, *table(records), END])
    text = path.read_text() if path.exists() else "# Live latency\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def table(records: list[dict[str, Any]]) -> list[str]:
    by = {(r["metric"], r["stat"]): r for r in records}
    first = records[0]
    where = first["config"].get("path", "cpu")
    swap = ("the runtime's GPU stages: NVDEC decode, the device's face analysis, the mesh swap of one "
            "face, label, mark and RGB -> NV12 on the GPU, x264 encode on the CPU (this GPU has no NVENC)"
            if where == "gpu" else "the CPU mesh swap (`live` preset) of one face")
    runs = []  # one run per path where `--only` put two runs' records together
    for r in records:
        run = (r["command"], r["device"], r["config"].get("load_average_1min_before"), r["commit"], r["date"])
        if run not in runs:
            runs.append(run)
    said = " ".join(f"`{c}` on {d} (load average {lo} before the run), commit {sha}, {day}."
                    for c, d, lo, sha, day in runs)
    lines = [f"{said} "
             f"Real peers on loopback, the server side in a process of its own; {swap}. A "
             "frame's latency runs from the publisher handing it to its encoder to the frame with the "
             "same stamped number reaching the player: both encodes, both hops, the server's "
             "decode, the swap and the player's decode; not capture or display.", "",
             "| path | size | p50 ms | p99 ms | max ms | frames | dropped | server stage p50 ms | NVDEC frames |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["stat"] != "p50" or "_latency_" not in r["metric"] or "handover" in r["metric"]:
            continue
        metric, size = r["metric"], r["metric"].rsplit("_", 1)[1]
        kind = "webrtc" if metric.startswith("webrtc") else "rtmp"
        label = {"webrtc": "WebRTC round trip: WHIP publisher -> swap -> same connection back",
                 "rtmp": "RTMP -> swap -> RTMP (nginx-rtmp both ways)"}[kind]

        def get(m: str, s: str) -> str:
            x = by.get((m, s))
            return f"{x['value']:g}" if x else "-"

        lines.append(f"| {label} | {size} | {get(metric, 'p50')} | {get(metric, 'p99')} | "
                     f"{get(metric, 'max')} | {get(f'{kind}_frames_measured_{size}', 'count')} | "
                     f"{get(f'{kind}_frames_dropped_{size}', 'count')} | "
                     f"{get(f'{kind}_swap_stage_{size}', 'p50')} | "
                     f"{get(f'{kind}_frames_decoded_on_nvdec_{size}', 'count')} |")
    lines.append("")
    if any(r["metric"].startswith("webrtc") for r in records):
        lines.append("The WebRTC path is `swapstream serve` as a user starts it: the publisher's video is "
                     "a stream of its runtime, and its server stage is that stream's latency from the "
                     "control API (the frame handed over by its reader to handed to the outgoing "
                     "tracks; p50 over its last 10 s).")
    if any(r["metric"].startswith("rtmp") for r in records):
        lines.append("The RTMP path is `swapstream live` as a user starts it (one stream of a runtime), "
                     "stopped with Ctrl+C; its server stage is the latency its summary line gives "
                     "(a frame's arrival to the end of its output call, x264's encode included).")
    for r in records:
        if "handover" in r["metric"]:
            lines.append(f"An aiortc player hands each frame over one frame interval later than it "
                         f"arrives (it waits for the next frame's first packet; browsers do not): "
                         f"measured that way the WebRTC round trip is {r['value']:g} ms (p50).")
        if r["metric"].startswith("rtmp_to_rtmp_latency") and r["stat"] == "p50":
            pub = r["config"].get("rtmp_publisher", "interleaved")
            lines.append("The RTMP publisher sent each packet as it was encoded." if pub == "spliced" else
                         "The RTMP publisher muxed through FFmpeg's FLV muxer (`--publisher interleaved`), "
                         "whose interleaving holds each frame until later audio is encoded: at 30 fps "
                         "one frame interval of the round trip is the publisher's.")
        if "_frames_dropped_at_start_" in r["metric"]:
            lines.append(f"Before its first frame out, the RTMP job skipped {r['value']:g} frames the "
                         f"publisher had sent while the job loaded, warmed up and opened its output "
                         f"(not in the table's dropped count, which starts at that frame).")
        if "offset" in r["metric"]:
            lines.append(f"WebRTC audio minus video delay at the publisher, after the server's "
                         f"hold: {r['value']:+g} ms (positive: audio later).")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=12.0, help="measured seconds per path")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds left out at the start")
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--fps", type=float, default=15.0)
    ap.add_argument("--config", default="live", help="preset, as `swapstream live/serve` use")
    ap.add_argument("--only", choices=("rtmp", "webrtc"))
    ap.add_argument("--publisher", choices=("spliced", "interleaved"), default="spliced",
                    help="the RTMP publisher's muxing: each packet as encoded (default), or FFmpeg's "
                         "FLV muxer, whose interleaving adds a frame interval at 30 fps")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="gpu: the GPU live job and the GPU WHIP server (NVDEC where PyNvVideoCodec "
                         "is installed); writes live_latency_gpu.{json,md}")
    args = ap.parse_args()
    gpu = args.device == "gpu"
    w, h = (int(x) for x in args.size.split("x"))
    cfg = load_config(args.config)
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    common = {"config": {"size": args.size, "fps": args.fps, "preset": args.config, "swapper": cfg.swapper,
                         "seconds": args.seconds, "warmup": args.warmup, "rtmp_publisher": args.publisher,
                         # Other work on the machine moves these figures: say how busy it was.
                         "load_average_1min_before": round(os.getloadavg()[0], 2), "path": args.device},
              **run_fields(gpu_and_cpu() if gpu else cpu_name(), command)}
    paths = [args.only] if args.only else ["rtmp", "webrtc"]
    records: list[dict[str, Any]] = []
    for path in paths:
        if path == "rtmp":
            try:
                find_nginx_rtmp()
            except SwapStreamError as e:
                sys.exit(f"error: the RTMP path needs nginx-rtmp: {e} (or use --only webrtc)")
        print(f"{path}: {args.warmup:g} s warm-up + {args.seconds:g} s ...", flush=True)
        if path == "rtmp":
            res = bench_rtmp(args.config, (w, h), args.fps, args.seconds, args.warmup, gpu,
                             args.publisher == "interleaved")
        else:
            res = asyncio.run(bench_webrtc(args.config, (w, h), args.fps, args.seconds, args.warmup, gpu))
        for key in ("dropped_at_start", "device"):
            if res.get(key):  # where a slow start goes (the frames dropped behind it)
                print(f"  {key}: {res[key]}")
        new = records_for(path, res, common, args.size)
        for r in new:
            print(f"  {r['metric']} {r['stat']}: {r['value']:g} {r['unit']}")
        records += new
    stem = "live_latency_gpu" if gpu else "live_latency"
    out_json = args.out / f"{stem}.json"
    if args.only and out_json.exists():
        kept = [r for r in json.loads(out_json.read_text()) if not r["metric"].startswith(args.only)]
        records = kept + records
    args.out.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(records, indent=1) + "\n")
    write_markdown(args.out / f"{stem}.md", records)
    print(f"wrote {out_json} and {stem}.md")


if __name__ == "__main__":
    main()
