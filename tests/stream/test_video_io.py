"""VideoReader / VideoWriter on real media: clips are synthesised with PyAV, read and re-encoded, and checked
by decoding the frame numbers drawn into every frame (see clips.py)."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

# The GPU machine has no PyAV; these tests run in CI.
av = pytest.importorskip("av")

sys.path.insert(0, str(Path(__file__).parent))

from clips import (  # noqa: E402
    audio_packets,
    audio_seconds,
    decoded_numbers,
    frame_pts,
    number_of,
    numbered_frame,
    write_clip,
)

from swapstream.errors import InputError, InputNotFoundError, OutputError, SwapStreamError  # noqa: E402
from swapstream.io.video import (  # noqa: E402
    AudioPacket,
    VideoInfo,
    VideoReader,
    VideoWriter,
    audio_plan,
    probe,
)
from swapstream.types import Frame  # noqa: E402

FRAMES = 30
# Irregular gaps (ms) like a phone recording that drops frames: 33, 40, 50, 33, 50, 33, 50, 33, 78, ...
VFR_PTS = [0, 33, 73, 123, 156, 206, 239, 289, 322, 400, 433, 466, 499, 549]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The inputs most tests share, written once: H.264 + AAC in MP4, and H.264 + PCM in MOV."""
    d = tmp_path_factory.mktemp("clips")
    made = {"aac_mp4": d / "aac.mp4", "pcm_mov": d / "pcm.mov"}
    write_clip(made["aac_mp4"], frames=FRAMES, audio="aac")
    write_clip(made["pcm_mov"], frames=FRAMES, audio="pcm_s16le")
    return made


def transcode(src: Path, dst: Path, **options: object) -> VideoWriter:
    """The CLI's file path in miniature: every frame and audio packet from a reader into a writer."""
    with VideoReader(src) as reader:
        info = reader.info
        with VideoWriter(
            dst,
            width=info.width,
            height=info.height,
            time_base=info.time_base,
            rate=info.avg_rate,
            audio_from=reader.audio_stream,
            **options,  # type: ignore[arg-type]
        ) as writer:
            for item in reader:
                if isinstance(item, Frame):
                    writer.write(item)
                else:
                    writer.write_audio(item)
    return writer


def assert_user_message(error: SwapStreamError, path: Path | str) -> None:
    message = str(error)
    assert "\n" not in message
    assert str(path) in message


def assert_same_timing(src: Path, dst: Path) -> None:
    """Frame count, rate, duration and every pts of `dst` are those of `src`."""
    a, b = probe(src), probe(dst)
    assert (b.width, b.height, b.codec) == (a.width, a.height, "h264")
    assert b.frames == a.frames
    assert b.avg_rate == a.avg_rate
    assert a.duration is not None and b.duration is not None and a.avg_rate is not None
    assert abs(b.duration - a.duration) <= 1 / a.avg_rate
    pts_a, tb_a = frame_pts(src)
    pts_b, tb_b = frame_pts(dst)
    assert tb_b == tb_a
    assert pts_b == pts_a


# -- reading -----------------------------------------------------------------------------------------


def test_probe_reports_what_the_file_declares(clips: dict[str, Path]) -> None:
    info = probe(clips["aac_mp4"])
    assert info == VideoInfo(
        path=str(clips["aac_mp4"]),
        width=96,
        height=64,
        time_base=info.time_base,
        avg_rate=Fraction(30),
        frames=FRAMES,
        duration=pytest.approx(1.0),  # type: ignore[arg-type]
        codec="h264",
        audio_codec="aac",
        audio_rate=48000,
    )
    assert probe(clips["pcm_mov"]).audio_codec == "pcm_s16le"


def test_reader_yields_rgb_frames_with_stream_timestamps_and_untouched_audio(clips: dict[str, Path]) -> None:
    src = clips["aac_mp4"]
    with VideoReader(src) as reader:
        items = list(reader)
    frames = [x for x in items if isinstance(x, Frame)]
    audio = [x for x in items if isinstance(x, AudioPacket)]
    assert len(frames) + len(audio) == len(items)

    assert [f.index for f in frames] == list(range(FRAMES))
    assert [number_of(f.data) for f in frames] == list(range(FRAMES))
    first = frames[0]
    assert (first.format, first.data.shape, first.data.dtype) == ("rgb24", (64, 96, 3), np.uint8)
    assert first.data.flags.c_contiguous
    pts, time_base = frame_pts(src)
    assert [f.pts for f in frames] == pts
    assert all(f.time_base == time_base == reader.info.time_base for f in frames)

    expected = audio_packets(src)
    assert [(a.pts, a.duration, bytes(a.packet)) for a in audio] == [(p.pts, p.duration, bytes(p)) for p in expected]
    assert all(a.time_base == expected[0].time_base for a in audio)


def test_reader_derives_missing_pts_from_the_rate(tmp_path: Path) -> None:
    raw = tmp_path / "raw.h264"  # an Annex B stream carries no timestamps at all
    write_clip(raw, frames=6, audio=None)
    with VideoReader(raw) as reader:
        frames = [f for f in reader if isinstance(f, Frame)]
        step = round(1 / (reader.info.avg_rate * reader.info.time_base))  # type: ignore[operator]
    assert [f.pts for f in frames] == [i * step for i in range(6)]
    assert [number_of(f.data) for f in frames] == list(range(6))


def test_reader_reads_odd_sizes(tmp_path: Path) -> None:
    src = tmp_path / "odd.mkv"
    write_clip(src, frames=4, size=(97, 65), codec="ffv1", pix_fmt="yuv444p", audio=None)
    with VideoReader(src) as reader:
        frames = [f for f in reader if isinstance(f, Frame)]
    assert (reader.info.width, reader.info.height) == (97, 65)
    assert all(f.data.shape == (65, 97, 3) and f.data.flags.c_contiguous for f in frames)
    assert [number_of(f.data) for f in frames] == [0, 1, 2, 3]


# -- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".mp4", ".mov"])
def test_round_trip_keeps_every_frame_its_timing_and_the_audio(
    clips: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    src, dst = clips["aac_mp4"], tmp_path / f"out{suffix}"
    writer = transcode(src, dst)
    assert (writer.frames_written, writer.pts_bumped, writer.audio_plan) == (FRAMES, 0, "copy")
    assert_same_timing(src, dst)
    assert decoded_numbers(dst) == list(range(FRAMES))
    assert probe(dst).audio_codec == "aac"
    assert len(audio_packets(dst)) == len(audio_packets(src))


def test_round_trip_into_matroska(clips: dict[str, Path], tmp_path: Path) -> None:
    src, dst = clips["aac_mp4"], tmp_path / "out.mkv"
    transcode(src, dst)
    # Matroska counts in milliseconds and cannot store the AAC priming packet's negative pts, so
    # FFmpeg shifts every stream by the same amount (at most one 1024-sample AAC frame): the frames'
    # spacing and A/V sync are kept, and the audio starts at 0.
    pts_a, tb_a = frame_pts(src)
    pts_b, tb_b = frame_pts(dst)
    assert tb_b == Fraction(1, 1000)
    shift = pts_b[0] - pts_a[0] * tb_a * 1000
    assert 0 <= shift <= 1024 / 48000 * 1000 + 1
    assert all(abs(b - (a * tb_a * 1000 + shift)) <= 1 for a, b in zip(pts_a, pts_b, strict=True))
    assert min(p.pts for p in audio_packets(dst)) == 0
    assert decoded_numbers(dst) == list(range(FRAMES))
    assert probe(dst).avg_rate == 30
    assert len(audio_packets(dst)) == len(audio_packets(src))


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_variable_frame_rate_survives(tmp_path: Path, suffix: str) -> None:
    src, dst = tmp_path / f"vfr{suffix}", tmp_path / f"vfr_out{suffix}"
    write_clip(src, pts=VFR_PTS, time_base=Fraction(1, 1000))
    transcode(src, dst)
    pts_a, tb_a = frame_pts(src)
    pts_b, tb_b = frame_pts(dst)
    assert tb_b == tb_a
    assert pts_b == pts_a
    assert [round(p * tb_a * 1000) for p in pts_b] == VFR_PTS
    assert decoded_numbers(dst) == list(range(len(VFR_PTS)))


# -- audio ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "codec", "plan"),
    [
        (".mp4", "aac", "copy"),
        (".mp4", "mp3", "copy"),
        (".mp4", "pcm_s16le", "aac"),
        (".MP4", "pcm_s16le", "aac"),
        ("mp4", "aac", "copy"),
        (".mov", "pcm_s16le", "copy"),
        (".webm", "opus", "copy"),
        (".webm", "vorbis", "copy"),
        (".webm", "aac", "libopus"),
        (".webm", "pcm_s16le", "libopus"),
        (".mkv", "aac", "copy"),
        (".mkv", "pcm_s16le", "copy"),
        (".mkv", "truehd", "copy"),
        (".flv", "aac", "copy"),
        (".flv", "opus", "aac"),
        (".xyz", "aac", "aac"),
    ],
)
def test_audio_plan(suffix: str, codec: str, plan: str) -> None:
    assert audio_plan(suffix, codec) == plan


def test_pcm_audio_into_mp4_is_transcoded_to_aac(clips: dict[str, Path], tmp_path: Path) -> None:
    src, dst = clips["pcm_mov"], tmp_path / "pcm.mp4"
    writer = transcode(src, dst)
    assert writer.audio_plan == "aac"
    info = probe(dst)
    assert (info.audio_codec, info.audio_rate) == ("aac", 48000)
    # AAC adds one frame of encoder priming (1024 samples, 21 ms) in front.
    assert abs(audio_seconds(dst) - audio_seconds(src)) < 0.05
    assert_same_timing(src, dst)


def test_pcm_audio_into_matroska_is_copied(clips: dict[str, Path], tmp_path: Path) -> None:
    src, dst = clips["pcm_mov"], tmp_path / "pcm.mkv"
    assert transcode(src, dst).audio_plan == "copy"
    assert probe(dst).audio_codec == "pcm_s16le"
    assert abs(audio_seconds(dst) - audio_seconds(src)) < 0.002


def test_aac_into_webm_is_transcoded_to_opus(clips: dict[str, Path], tmp_path: Path) -> None:
    src, dst = clips["aac_mp4"], tmp_path / "out.webm"
    writer = transcode(src, dst, codec="libvpx-vp9")
    assert writer.audio_plan == "libopus"
    info = probe(dst)
    assert (info.codec, info.audio_codec) == ("vp9", "opus")
    assert abs(audio_seconds(dst) - 1.0) < 0.05
    assert decoded_numbers(dst) == list(range(FRAMES))


def test_write_audio_without_an_audio_stream_is_a_programming_error(clips: dict[str, Path], tmp_path: Path) -> None:
    with VideoReader(clips["aac_mp4"]) as reader:
        packet = next(x for x in reader if isinstance(x, AudioPacket))
        with VideoWriter(tmp_path / "o.mp4", width=96, height=64, time_base=Fraction(1, 30), rate=Fraction(30)) as w:
            with pytest.raises(ValueError, match="audio_from"):
                w.write_audio(packet)


# -- writing -------------------------------------------------------------------------------------------


def write_frames(path: Path, pts: list[int | None], *, size: tuple[int, int] = (96, 64), **options: object) -> VideoWriter:
    width, height = size
    time_base = Fraction(1, 1000)
    with VideoWriter(path, width=width, height=height, time_base=time_base, **options) as writer:  # type: ignore[arg-type]
        for i, p in enumerate(pts):
            writer.write(Frame(numbered_frame(i, width, height), p, time_base, index=i))
    return writer


def test_non_increasing_pts_are_bumped_and_counted(tmp_path: Path) -> None:
    dst = tmp_path / "bump.mkv"
    writer = write_frames(dst, [0, 40, 40, 20, 100, None, 200], rate=Fraction(25))
    assert (writer.frames_written, writer.pts_bumped) == (7, 2)
    # 40 and 20 become last+1; the missing pts continues at the nominal 25 fps.
    assert frame_pts(dst)[0] == [0, 40, 41, 42, 100, 140, 200]
    assert decoded_numbers(dst) == list(range(7))


def test_odd_sizes_are_cropped_to_even(tmp_path: Path) -> None:
    dst = tmp_path / "odd.mp4"
    write_frames(dst, [0, 40, 80], size=(97, 65), rate=Fraction(25))
    info = probe(dst)
    assert (info.width, info.height) == (96, 64)
    assert decoded_numbers(dst) == [0, 1, 2]


def test_colours_survive_the_yuv_round_trip(tmp_path: Path) -> None:
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0), (200, 120, 40)]
    bars = np.zeros((64, 96, 3), np.uint8)
    for i, colour in enumerate(colours):
        bars[:, i * 16 : (i + 1) * 16] = colour
    dst = tmp_path / "bars.mp4"
    with VideoWriter(dst, width=96, height=64, time_base=Fraction(1, 30), rate=Fraction(30)) as writer:
        for i in range(3):
            writer.write(Frame(bars, i, Fraction(1, 30)))
    with VideoReader(dst) as reader:
        last = [f for f in reader if isinstance(f, Frame)][-1].data
    got = last[24:40, [i * 16 + 8 for i in range(6)]].astype(int).mean(axis=0)
    assert np.abs(got - np.array(colours)).max() <= 6


def test_nv12_frames_from_the_gpu_converter_match_rgb_frames(tmp_path: Path) -> None:
    """A GPU stream hands the writer NV12 it converted itself (`rgb_to_nv12` with BT.709, here its
    NumPy reference): the file decodes to the picture the RGB path writes, at the same timestamps."""
    from swapstream.kernels.nv12 import rgb_to_nv12_ref

    rng = np.random.default_rng()
    h, w = 64, 96
    frames = [np.repeat(np.repeat(rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8), 8, 0), 8, 1)
              for _ in range(4)]
    decoded = {}
    for kind in ("rgb24", "nv12"):
        dst = tmp_path / f"{kind}.mp4"
        with VideoWriter(dst, width=w, height=h, time_base=Fraction(1, 30), rate=Fraction(30), crf=0) as writer:
            for i, rgb in enumerate(frames):
                if kind == "nv12":
                    nv12 = np.full((h * 3 // 2, w), 77, np.uint8)  # poisoned: every byte is written
                    rgb_to_nv12_ref(rgb, nv12[:h], nv12[h:], matrix="bt709")
                    writer.write_nv12(nv12, i * 2, Fraction(1, 30))
                else:
                    writer.write(Frame(rgb, i * 2, Fraction(1, 30), i))
        with VideoReader(dst) as reader:
            decoded[kind] = [(f.pts * f.time_base, f.data.astype(int)) for f in reader if isinstance(f, Frame)]
    times = [Fraction(2 * i, 30) for i in range(4)]  # MP4 counts in a finer time base: compare seconds
    assert [t for t, _ in decoded["rgb24"]] == [t for t, _ in decoded["nv12"]] == times
    inside = np.zeros((h, w), bool)  # the middle of each 8x8 block, away from its chroma edges
    for i in range(0, h, 8):
        for j in range(0, w, 8):
            inside[i + 2:i + 6, j + 2:j + 6] = True
    for src, (_, a), (_, b) in zip(frames, decoded["rgb24"], decoded["nv12"]):
        # Inside the blocks both are the same BT.709 limited-range conversion, rounded differently
        # by a level at most. At block edges swscale's chroma filter reaches over the neighbours,
        # where the kernel's 2x2 mean (aligned with the blocks) does not: the converter is the closer.
        assert np.abs(a - b)[inside].mean() < 1.0
        assert np.abs(b - src).mean() <= np.abs(a - src).mean()
    with VideoWriter(tmp_path / "bad.mp4", width=w, height=h, time_base=Fraction(1, 30), rate=Fraction(30)) as writer:
        writer.write(Frame(frames[0], 0, Fraction(1, 30)))
        with pytest.raises(ValueError, match="NV12 frame for this writer is a 96x96"):
            writer.write_nv12(np.zeros((h, w), np.uint8), 1, Fraction(1, 30))


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_metadata_is_written(tmp_path: Path, suffix: str) -> None:
    dst = tmp_path / f"tagged{suffix}"
    write_frames(dst, [0, 40], rate=Fraction(25), metadata={"comment": "made by swapstream"})
    with av.open(str(dst)) as container:
        # Matroska stores tag names in capitals.
        assert {k.lower(): v for k, v in container.metadata.items()}["comment"] == "made by swapstream"


def test_missing_output_folders_are_created_and_close_is_idempotent(tmp_path: Path) -> None:
    dst = tmp_path / "new" / "deeper" / "out.mp4"
    writer = write_frames(dst, [0, 40], rate=Fraction(25))
    writer.close()
    assert decoded_numbers(dst) == [0, 1]
    with pytest.raises(ValueError, match="closed"):
        writer.write(Frame(numbered_frame(0), 80, Fraction(1, 1000)))


# -- errors ----------------------------------------------------------------------------------------------


def test_missing_input(tmp_path: Path) -> None:
    path = tmp_path / "nope.mp4"
    for open_it in (probe, VideoReader):
        with pytest.raises(InputNotFoundError) as caught:
            open_it(path)
        assert_user_message(caught.value, path)


def test_text_file_named_mp4(tmp_path: Path) -> None:
    path = tmp_path / "notes.mp4"
    path.write_text("this is not a video\n")
    for open_it in (probe, VideoReader):
        with pytest.raises(InputError) as caught:
            open_it(path)
        assert_user_message(caught.value, path)
        assert "Check that it is a complete video file" in str(caught.value)


def test_directory_as_input(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        VideoReader(tmp_path)
    assert_user_message(caught.value, tmp_path)


# What each cut gives today (checked): a decodable head -> its frames, in order, without an error;
# nothing decodable -> InputError naming the file. Each case expects exactly one of the two.
# TODO(live-reliability issue): a cut whose head decodes should later also say that the input ended
# early (the CLI: exit 3 with a `warning:` line); these cases stay "frames" then, with the warning.
@pytest.mark.parametrize(
    ("name", "options", "keep", "outcome"),
    [
        ("plain.mp4", None, 0.5, "error"),  # index (moov) at the end: half a file has none
        ("plain.mp4", None, 0.02, "error"),
        ("faststart.mp4", {"movflags": "+faststart"}, 0.5, "frames"),  # index first: frames survive
        ("faststart.mp4", {"movflags": "+faststart"}, 0.02, "error"),  # the index and no frame data
        ("stream.mkv", None, 0.5, "frames"),
        ("stream.mkv", None, 0.02, "error"),
    ],
)
def test_truncated_input_gives_surviving_frames_or_input_error(
    tmp_path: Path, name: str, options: dict[str, str] | None, keep: float, outcome: str
) -> None:
    whole = tmp_path / name
    write_clip(whole, frames=60, container_options=options)
    cut = tmp_path / f"cut_{name}"
    data = whole.read_bytes()
    cut.write_bytes(data[: int(len(data) * keep)])
    if outcome == "error":
        with pytest.raises(InputError) as caught:
            with VideoReader(cut) as reader:
                for _ in reader:
                    pass
        assert_user_message(caught.value, cut)
        return
    with VideoReader(cut) as reader:
        numbers = [number_of(f.data) for f in reader if isinstance(f, Frame)]
    # About half the frames (25 and 28 measured), from the first on, none skipped or repeated.
    assert 15 <= len(numbers) < 45, len(numbers)
    assert numbers == list(range(len(numbers)))


def test_corrupt_packets_are_skipped_like_ffmpeg_does(tmp_path: Path) -> None:
    whole = tmp_path / "whole.mp4"
    write_clip(whole, frames=60)
    data = bytearray(whole.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 2000, 7):
        data[i] ^= 0x5A
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(bytes(data))
    with VideoReader(bad) as reader:
        numbers = [number_of(f.data) for f in reader if isinstance(f, Frame)]
    assert 0 < len(numbers) < 60
    assert numbers == sorted(set(numbers))  # nothing duplicated or reordered
    assert reader.skipped_packets > 0


@pytest.mark.parametrize(
    "where",
    [
        "afile/out.mp4",  # the parent is a regular file (tests run as root, so permissions do not stop them)
        "deeper/afile/x/out.mp4",
        "adir.mp4",  # the output is an existing directory
        "/proc/out.mp4",  # a file system that takes no new files
    ],
)
def test_unwritable_output(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "deeper").mkdir()
    (tmp_path / "deeper" / "afile").write_text("x")
    (tmp_path / "adir.mp4").mkdir()
    path = Path(where) if where.startswith("/") else tmp_path / where
    with pytest.raises(OutputError) as caught:
        VideoWriter(path, width=96, height=64, time_base=Fraction(1, 30), rate=Fraction(30))
    assert_user_message(caught.value, path)
    assert "--output" in str(caught.value)


@pytest.mark.parametrize("name", ["out.xyz", "out", "out.webm"])
def test_output_suffix_without_a_usable_container(tmp_path: Path, name: str) -> None:
    # .webm exists but cannot hold H.264.
    path = tmp_path / name
    with pytest.raises(OutputError) as caught:
        VideoWriter(path, width=96, height=64, time_base=Fraction(1, 30), rate=Fraction(30))
    assert_user_message(caught.value, path)
    assert not path.exists()  # no empty file left behind


def test_frames_are_writable_for_in_place_processing(clips: dict[str, Path]) -> None:
    with VideoReader(clips["aac_mp4"]) as reader:
        frame = next(x for x in reader if isinstance(x, Frame))
        frame.data[:8, :8] = 0  # the swapper pastes faces into the decoded frame in place
        with pytest.raises(RuntimeError, match="only once"):
            iter(reader)


def test_failed_job_leaves_no_empty_output(tmp_path: Path) -> None:
    dst = tmp_path / "out.mp4"
    with pytest.raises(InputError):
        with VideoWriter(dst, width=96, height=64, time_base=Fraction(1, 30), rate=Fraction(30)):
            raise InputError("no frames")
    assert not dst.exists()


def test_display_rotation_is_applied_like_ffmpeg(tmp_path: Path) -> None:
    """A phone clip stored sideways with a display matrix comes out upright, as `ffmpeg` shows it."""
    path = tmp_path / "portrait.mp4"
    coded = np.zeros((32, 64, 3), np.uint8)
    coded[:16, :32] = 250  # bright top-left quadrant of the coded picture
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 64, 32, "yuv420p"
        s.set_display_rotation(-90)  # display = coded turned 90 degrees clockwise
        for i in range(3):
            f = av.VideoFrame.from_ndarray(coded, format="rgb24")
            f.pts = i
            c.mux(s.encode(f))
        c.mux(s.encode(None))
    info = probe(path)
    assert (info.width, info.height, info.rotation) == (32, 64, 270)
    with VideoReader(path) as r:
        frames = [x for x in r if not isinstance(x, AudioPacket)]
    assert len(frames) == 3
    img = frames[0].data
    assert img.shape == (64, 32, 3) and img.flags.c_contiguous
    # Turned clockwise, the coded top-left quadrant is now the top-right one.
    assert img[:32, 16:].mean() > 200 and img[:32, :16].mean() < 50 and img[32:].mean() < 50
