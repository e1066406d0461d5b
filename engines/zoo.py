"""The FaceFusion-compatible model zoo: one declarative table of every model we can download.

Each entry says where the file comes from, under which licence, and exactly what the model expects
and returns (docs/neural.md, "Model contracts"), so that pre- and post-processing read their numbers
from here instead of repeating them. FaceFusion keeps the same metadata per module, spread over its
processors; keeping it in one place is what we borrow from it. Nothing here touches the network:
`download.py` does that.

Conventions for every image model:
- the crop is normalised as `(x / 255 - mean) / std` per channel, in the `channels` order;
- inputs and outputs are float32 NCHW whatever `dtype` says, because FaceFusion feeds float32 to every
  one of these files (the fp16 ones cast inside the graph), and ONNX Runtime rejects a wrong dtype.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np

from .errors import EngineUserError

ASSETS_BASE_URL = "https://github.com/facefusion/facefusion-assets/releases/download"
"""Where FaceFusion publishes its models: `{ASSETS_BASE_URL}/{release}/{file}`."""

Kind = Literal["swapper", "detector", "embedder", "landmarker", "converter", "occluder", "parser",
               "enhancer"]
SourceInput = Literal["embedding", "image", "none"]
Embedding = Literal["emap", "normalized", "converter:crossface_simswap",
                    "converter:crossface_hififace", "converter:crossface_ghost", "none"]
OutputRange = Literal["0_1_clip", "std_mean", "raw"]
DType = Literal["float32", "float16"]
DetectorFamily = Literal["scrfd", "retinaface", "yoloface", "yunet"]
Channels = Literal["RGB", "BGR"]
Layout = Literal["NCHW", "NHWC"]

_HASH_RE = re.compile(r"[0-9a-f]{8}")


class UnknownModelError(EngineUserError, KeyError):
    """A model name that is not in the zoo; the message lists the known names."""

    def __str__(self) -> str:
        # KeyError's own __str__ quotes its argument, which would put quotes around the CLI's one line.
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ModelSpec:
    """One model file of the zoo and its input/output contract."""

    name: str
    """Name users type (`swapstream models download NAME`); the file name without `.onnx`."""
    kind: Kind
    """What the model does in the pipeline; `converter` maps an ArcFace embedding to a swapper's space."""
    release: str
    """facefusion-assets release that holds the file, e.g. `models-3.0.0`."""
    file: str
    """File name in the release and on disk, e.g. `inswapper_128.onnx`."""
    licence: str
    """Licence of the weights, shown to the user before the first download."""
    template: str | None = None
    """Warp template (a key of TEMPLATES) the crop is aligned to; None for models fed without one."""
    size: int | None = None
    """Side of the square image input in pixels; None for models without an image input."""
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Per-channel mean in `(x / 255 - mean) / std`."""
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    """Per-channel standard deviation in `(x / 255 - mean) / std`."""
    channels: Channels = "RGB"
    """Channel order of the image input (FaceFusion feeds its detectors and 2dfan4 BGR frames)."""
    input_names: tuple[str, ...] = ("input",)
    """Graph input names, in the order a runner should list them."""
    output_names: tuple[str, ...] = ()
    """Graph output names where pinned; empty: take outputs by position, as FaceFusion does."""
    source_input: SourceInput = "none"
    """What a swapper's `source` input takes: an identity embedding or an aligned face image."""
    embedding: Embedding = "none"
    """How the ArcFace embedding becomes the `source` input (`converter:NAME` runs that zoo model first)."""
    embedding_l2: bool = False
    """L2-normalise the vector fed to `source` (after the emap or converter); ghost takes it raw."""
    output_range: OutputRange = "raw"
    """How a swapper's output becomes [0, 1]: clip it, or `x * std + mean` then clip; `raw` for non-images."""
    dtype: DType = "float32"
    """Precision of the weights in the file (its inputs and outputs are float32 either way)."""
    detector_family: DetectorFamily | None = None
    """Which decoder a detector's outputs need (docs/neural.md, "Detectors")."""
    layout: Layout = "NCHW"
    """Layout of the image input (and of an occluder's mask output): the XSeg occluders, trained in
    TensorFlow, take NHWC."""

    def url_for(self, base_url: str = ASSETS_BASE_URL) -> str:
        """The file's URL under another base (a mirror, or a test server)."""
        return f"{base_url.rstrip('/')}/{self.release}/{self.file}"

    def hash_url_for(self, base_url: str = ASSETS_BASE_URL) -> str:
        """The URL of the `.hash` sibling under another base."""
        return f"{base_url.rstrip('/')}/{self.release}/{self.hash_file}"

    @property
    def url(self) -> str:
        """Where FaceFusion publishes the file."""
        return self.url_for()

    @property
    def hash_url(self) -> str:
        """Where FaceFusion publishes the file's CRC32 (8 hex digits)."""
        return self.hash_url_for()

    @property
    def hash_file(self) -> str:
        """Name of the `.hash` sibling: `X.onnx` has `X.hash`."""
        return Path(self.file).stem + ".hash"

    @property
    def converter(self) -> str | None:
        """The zoo model that must turn the embedding into this swapper's input, if any."""
        prefix = "converter:"
        return self.embedding[len(prefix):] if self.embedding.startswith(prefix) else None


def _pts(*xy: float) -> np.ndarray:
    a = np.array(xy, dtype=np.float32).reshape(5, 2)
    a.flags.writeable = False  # shared by every caller: an in-place edit would move everyone's warps
    return a


TEMPLATES: Mapping[str, np.ndarray] = MappingProxyType({
    # Points normalised to the crop size: left eye, right eye, nose tip, left and right mouth corner.
    "arcface_112_v1": _pts(.35473214, .45658929, .64526786, .45658929, .5, .61154464,
                           .37913393, .776875, .62086607, .776875),
    "arcface_112_v2": _pts(.34191607, .46157411, .65653393, .45983393, .500225, .64050536,
                           .37097589, .82469196, .63151696, .82325089),
    "arcface_128": _pts(.36167656, .40387734, .63696719, .40235469, .50019687, .56044219,
                        .38710391, .72160547, .61507734, .72034453),
    "ffhq_512": _pts(.37691676, .46864664, .62285697, .46912813, .50123859, .61331904,
                     .39308822, .725411, .61150205, .72490465),
    "mtcnn_512": _pts(.36562865, .46733799, .63305391, .46585885, .50019127, .61942959,
                      .39032951, .77598822, .61178945, .77476328),
})
"""The five warp templates (docs/neural.md, "Warp templates"), 5x2 float32, read-only."""

_HALF = (0.5, 0.5, 0.5)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
# (x - 127.5) / 128 written as (x / 255 - mean) / std.
_DETECT_STD = (128 / 255,) * 3
# Raw 0-255 pixels written as (x / 255 - 0) / (1 / 255).
_RAW_STD = (1 / 255,) * 3
# x / 255 written as (x / 255 - 0) / 1.
_RAW_01 = (1.0, 1.0, 1.0)
_SWAP_IO = ("target", "source")

_NONCOMMERCIAL_INSIGHTFACE = "non-commercial (InsightFace)"
_UNKNOWN = "unknown: FaceFusion lists none for this model; check the upstream project ({})"


def _swapper(name: str, release: str, licence: str, template: str, size: int,
             mean: tuple[float, float, float], std: tuple[float, float, float], *,
             source_input: SourceInput = "embedding", embedding: Embedding = "none",
             embedding_l2: bool = False, output_range: OutputRange = "0_1_clip",
             dtype: DType = "float32") -> ModelSpec:
    return ModelSpec(name=name, kind="swapper", release=release, file=f"{name}.onnx", licence=licence,
                     template=template, size=size, mean=mean, std=std, input_names=_SWAP_IO,
                     source_input=source_input, embedding=embedding, embedding_l2=embedding_l2,
                     output_range=output_range, dtype=dtype)


def _converter(name: str) -> ModelSpec:
    # Trained by FaceFusion (facefusion-labs/crossface): (1, 512) ArcFace embedding in, (1, 512) out.
    return ModelSpec(name=name, kind="converter", release="models-3.4.0", file=f"{name}.onnx",
                     licence="OpenRAIL-MS (FaceFusion)", input_names=("input",), output_names=("output",))


def _detector(name: str, release: str, licence: str, family: DetectorFamily,
              mean: tuple[float, float, float], std: tuple[float, float, float]) -> ModelSpec:
    # 640 is the largest size FaceFusion offers for each of them; scrfd and retinaface take 160-640.
    return ModelSpec(name=name, kind="detector", release=release, file=f"{name}.onnx", licence=licence,
                     size=640, mean=mean, std=std, channels="BGR", detector_family=family)


def _occluder(name: str, release: str) -> ModelSpec:
    # DeepFaceLab's XSeg: 256, NHWC, BGR / 255 in; (N, 256, 256, 1) face probability out.
    return ModelSpec(name=name, kind="occluder", release=release, file=f"{name}.onnx",
                     licence="GPL-3.0 (XSeg, DeepFaceLab)", size=256, std=_RAW_01, channels="BGR",
                     layout="NHWC")


def _parser(name: str, release: str) -> ModelSpec:
    # yakhyo/face-parsing's BiSeNet: 512, RGB, ImageNet-normalised in; 19-class logits out (first output).
    return ModelSpec(name=name, kind="parser", release=release, file=f"{name}.onnx",
                     licence="MIT (face-parsing, yakhyo)", size=512, mean=_IMAGENET_MEAN, std=_IMAGENET_STD)


def _enhancer(name: str, licence: str, template: str = "ffhq_512", size: int = 512) -> ModelSpec:
    # FaceFusion's face_enhancer: RGB, (x/255 - .5)/.5 in; RGB in [-1, 1] out (clip, then x*.5+.5).
    return ModelSpec(name=name, kind="enhancer", release="models-3.0.0", file=f"{name}.onnx",
                     licence=licence, template=template, size=size, mean=_HALF, std=_HALF,
                     output_range="std_mean")


_SPECS: tuple[ModelSpec, ...] = (
    # Swappers (docs/neural.md, "Swappers").
    _swapper("inswapper_128", "models-3.0.0", _NONCOMMERCIAL_INSIGHTFACE, "arcface_128", 128,
             (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), embedding="emap", embedding_l2=True),
    _swapper("inswapper_128_fp16", "models-3.0.0", _NONCOMMERCIAL_INSIGHTFACE, "arcface_128", 128,
             (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), embedding="emap", embedding_l2=True, dtype="float16"),
    *(_swapper(f"hyperswap_1{v}_256", "models-3.3.0", "ResearchRAIL (FaceFusion)", "arcface_128", 256,
               _HALF, _HALF, embedding="normalized", embedding_l2=True, output_range="std_mean",
               dtype="float16")
      for v in "abc"),
    _swapper("simswap_256", "models-3.0.0", "non-commercial (SimSwap, neuralchen)", "arcface_112_v1", 256,
             _IMAGENET_MEAN, _IMAGENET_STD, embedding="converter:crossface_simswap", embedding_l2=True),
    _swapper("simswap_unofficial_512", "models-3.0.0", "non-commercial (SimSwap, neuralchen)",
             "arcface_112_v1", 512, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
             embedding="converter:crossface_simswap", embedding_l2=True),
    _swapper("hififace_unofficial_256", "models-3.1.0", _UNKNOWN.format("HifiFace, GuijiAI"), "mtcnn_512",
             256, _HALF, _HALF, embedding="converter:crossface_hififace", embedding_l2=True,
             output_range="std_mean"),
    *(_swapper(f"ghost_{v}_256", "models-3.0.0", "Apache-2.0 (GHOST, ai-forever)", "arcface_112_v1", 256,
               _HALF, _HALF, embedding="converter:crossface_ghost", output_range="std_mean")
      for v in "123"),
    _swapper("blendswap_256", "models-3.0.0", "non-commercial (BlendFace, mapooon)", "ffhq_512", 256,
             (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), source_input="image"),
    _swapper("uniface_256", "models-3.0.0", _UNKNOWN.format("UniFace, xc-csc101"), "ffhq_512", 256,
             _HALF, _HALF, source_input="image", output_range="std_mean"),
    # Embedding converters that the simswap, hififace and ghost swappers need.
    _converter("crossface_simswap"),
    _converter("crossface_hififace"),
    _converter("crossface_ghost"),
    # Detectors (docs/neural.md, "Detectors"). FaceFusion 3.x fetches yunet from models-3.4.0, the release
    # that added it; it is in no earlier one.
    _detector("scrfd_2.5g", "models-3.0.0", _NONCOMMERCIAL_INSIGHTFACE, "scrfd", _HALF, _DETECT_STD),
    _detector("retinaface_10g", "models-3.0.0", _NONCOMMERCIAL_INSIGHTFACE, "retinaface", _HALF,
              _DETECT_STD),
    _detector("yoloface_8n", "models-3.0.0", "GPL-3.0 (yolov8-face, derronqi)", "yoloface",
              (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    _detector("yunet_2023_mar", "models-3.4.0", "MIT (YuNet, OpenCV)", "yunet", (0.0, 0.0, 0.0), _RAW_STD),
    # Landmarks and recognition (docs/neural.md, "Landmarks and recognition"). 2dfan4 is cropped from
    # the box, not warped to a template.
    ModelSpec(name="2dfan4", kind="landmarker", release="models-3.0.0", file="2dfan4.onnx",
              licence="MIT (2DFAN4, breadbread1984)", size=256, channels="BGR"),
    ModelSpec(name="arcface_w600k_r50", kind="embedder", release="models-3.0.0",
              file="arcface_w600k_r50.onnx", licence=_NONCOMMERCIAL_INSIGHTFACE, template="arcface_112_v2",
              size=112, mean=_HALF, std=_HALF),
    # Occluders, parsers and enhancers (docs/neural.md, "Occluders and parsers", "Enhancers"), as
    # FaceFusion's face_masker.py and face_enhancer/core.py list them, releases included.
    _occluder("xseg_1", "models-3.1.0"),
    _occluder("xseg_2", "models-3.1.0"),
    _occluder("xseg_3", "models-3.2.0"),
    _parser("bisenet_resnet_18", "models-3.1.0"),
    _parser("bisenet_resnet_34", "models-3.0.0"),
    _enhancer("gfpgan_1.4", "Apache-2.0 (GFPGAN, TencentARC)"),
    _enhancer("codeformer", "S-Lab-1.0 (CodeFormer, sczhou; non-commercial)"),
    _enhancer("gpen_bfr_512", "non-commercial (GPEN, yangxy)"),
    _enhancer("restoreformer_plus_plus", "Apache-2.0 (RestoreFormer++, wzhouxiff)"),
)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({s.name: s for s in _SPECS})
"""Every model of the zoo by name, in listing order."""


def get_spec(name: str) -> ModelSpec:
    """The zoo entry for `name`, or an UnknownModelError that lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model '{name}'; known models: {', '.join(MODELS)}") from None


def crc32_file(path: Path) -> str:
    """CRC32 of a file as 8 lower-case hex digits, the format of FaceFusion's `.hash` files."""
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def parse_hash(text: str) -> str | None:
    """The CRC32 held by a `.hash` file's text, lower-cased, or None if it holds something else."""
    value = text.strip().lower()
    return value if _HASH_RE.fullmatch(value) else None
