"""The runtime's GPU stages on a real GPU (`pytest -m gpu`): a stream on `cuda:0` decodes into GPU
memory (NVDEC where PyNvVideoCodec is installed), is analysed by the device's shared analysis,
swapped, labelled and marked on the device, and written as HLS from one NV12 download. What came out
is decoded and checked: every frame, in order, faces swapped, the watermark found."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
av = pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from swapstream.demo import astronaut  # noqa: E402
from swapstream.runtime.manager import StreamRuntime  # noqa: E402
from swapstream.runtime.stream import InputSpec, OutputSpec, StreamSpec  # noqa: E402
from swapstream.verify import verify  # noqa: E402

from .conftest import FPS, runtime_config  # noqa: E402


def _gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("swapper", ["mesh"])
def test_a_stream_on_the_gpu_stages(clip: tuple[Path, list[Any]], tmp_path: Path, swapper: str) -> None:
    path, frames = clip
    hls = tmp_path / "hls"

    async def run() -> dict[str, Any]:
        rt = StreamRuntime(runtime_config(), devices=["cuda:0"])
        await rt.start()
        try:
            # The swap backend's source analysis, warmed before the clip plays: the frames are few.
            await rt.slots[0].call(swapper, lambda e: e.identity(astronaut()))
            spec = StreamSpec("g", InputSpec(str(path), realtime=True),
                              (OutputSpec("hls", str(hls)), OutputSpec("null")), swapper=swapper)
            p = await rt.add_stream(spec)
            assert p._decode is not None and p._compose is not None and p._analyser is None
            await p.set_source(astronaut())
            await asyncio.wait_for(p.done.wait(), 60)
            info = p.info()
            info["nvdec"] = p._decode.nvdec
            info["decoded"] = p._decode.frames
            info["analysis_built"] = rt.slots[0]._analysis is not None
            return info
        finally:
            await rt.close()

    info = asyncio.run(run())
    assert info["state"] == "ended", info
    assert info["analysis_built"]
    if importlib.util.find_spec("PyNvVideoCodec") is not None:
        assert info["nvdec"], "PyNvVideoCodec is installed: the stream must decode on NVDEC"
    # Paced at the clip's rate, nothing is dropped: every frame in, every frame out, in order.
    assert info["frames_in"] == len(frames) == info["decoded"], info
    assert info["frames_out"] == len(frames) - sum(v for k, v in info["dropped"].items() if k != "at_stop"), info
    assert info["pts_regressions"] == 0
    # Frames that came before the source face, or were dropped while the stream's first frame
    # started its decoder, are not swapped; those after are.
    assert info["faces_swapped"] >= 10, info
    report = verify(str(hls / "index.m3u8"))
    assert report.frame_count >= info["frames_out"] - FPS  # the last segment may be short
    assert report.found, report.to_dict()["summary"]
