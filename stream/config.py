"""Typed configuration: dataclass-like pydantic models, YAML presets and `--set key=value` overrides.

Every field carries a one-line docstring, which pydantic keeps as the field's description
(`use_attribute_docstrings`), so `swapstream config` can print them. Unknown keys are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError
from .netpolicy import DEFAULT_ALLOWED_HOSTS, HostPattern

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              frozen=False)


class DetectorConfig(_Section):
    model: Literal["short_range", "full_range"] = "short_range"
    """BlazeFace variant: short_range for faces filling a good part of the frame, full_range for small faces."""
    min_score: float = Field(0.5, ge=0.0, le=1.0)
    """Minimum detection confidence."""
    # Each tracked face costs a landmark inference and a swap on every frame: 16 faces at 30 fps is
    # already ~500 landmark runs a second for one stream (the broadcast preset uses 8).
    max_faces: int = Field(4, ge=1, le=16)
    """Most faces tracked and swapped per frame."""
    # No upper bound: a larger value only costs less. (The controller's detect_less step multiplies it
    # by runtime.detect_less_factor, and a bound here could refuse that assignment.)
    detect_every: int = Field(1, ge=1)
    """Run the detector every N frames; landmarks track the faces in between."""
    nms_iou: float = Field(0.3, gt=0.0, le=1.0)
    """Overlap above which two detections are merged (weighted NMS)."""
    # Each stream's analyser runs three LiteRT interpreters (two detectors, the landmarks), each with
    # this many threads: at 4 a stream adds about a dozen, where 64 took a process from 11 threads to
    # 209. The models take 128-192 pixel inputs: past 4 threads the hand-offs cost what they save.
    threads: int = Field(1, ge=1, le=4)
    """CPU threads for the LiteRT detector and landmark models."""


class LandmarkConfig(_Section):
    min_presence: float = Field(0.5, ge=0.0, le=1.0)
    """Face-presence score under which a tracked face is dropped."""
    roi_scale: float = Field(1.5, gt=1.0, le=3.0)
    """Landmark crop size relative to the face box (MediaPipe uses 1.5)."""
    compile: bool = False
    """On the GPU: torch.compile the built-in detector and landmark networks (fewer, fused kernels
    per call; batch sizes run in graphs of powers of two). Start-up compiles each size: seconds each."""


class SmoothingConfig(_Section):
    enabled: bool = True
    """Filter landmarks over time (One Euro filter) so that the swap does not jitter on a still head."""
    min_cutoff: float = Field(1.0, gt=0.0)
    """Cut-off frequency (Hz) at rest: lower smooths more."""
    beta: float = Field(0.5, ge=0.0)
    """Speed coefficient: higher follows fast motion with less lag (speed measured in face sizes/s)."""
    d_cutoff: float = Field(1.0, gt=0.0)
    """Cut-off frequency (Hz) of the speed estimate."""


class MeshConfig(_Section):
    keep_mouth: bool = True
    """Keep the target's inner mouth so that speech and expressions come through."""
    keep_eyes: bool = False
    """Keep the target's eyes so that gaze comes through."""
    feather: float = Field(0.05, ge=0.0, le=0.5)
    """Width of the soft mask edge, as a fraction of the face size."""
    color_match: Literal["lab", "rgb", "none"] = "lab"
    """Colour space for matching the source skin to the target (mean and std inside the mask)."""
    color_strength: float = Field(1.0, ge=0.0, le=1.0)
    """0 keeps the source colours, 1 matches the target fully."""


class MaskConfig(_Section):
    occlusion: bool = True
    """Keep the target where something is in front of the face (hair, glasses, a hand, a microphone): face pixels unlike the colour of the target's own cheeks are not painted over (built-in mesh swapper)."""
    # Below about 2 standard deviations ordinary skin (shading, a flush) starts to count as an
    # occluder and holes appear in the swap; past 10 only black or saturated colours would.
    occlusion_threshold: float = Field(3.0, ge=1.5, le=10.0)
    """Colour distance from the learned skin, in standard deviations, at which a pixel starts to count as an occluder (lower keeps more of the target)."""
    occlusion_smoothing: float = Field(0.5, gt=0.0, le=1.0)
    """Weight of the newest frame in each face's moving average of the mask: lower is steadier on a still head and slower to follow a hand (1: no smoothing)."""
    hands: bool = False
    """Keep the target where a hand is in front of the face, found by MediaPipe's hand models (built-in mesh swapper). The colour model of `mask.occlusion` misses a hand of the face's own skin tone; this does not. Off by default: on 2 CPU cores the lite models cost about 14 ms a frame per followed hand, plus 27 ms for the palm detector every `mask.hands_detect_every` frames (README, "Hands")."""
    hands_model: Literal["lite", "full"] = "lite"
    """MediaPipe's hand models: `lite` (about half the CPU time) or `full` (complexity 1)."""
    hands_detect_every: int = Field(3, ge=1, le=30)
    """Run the palm detector every N frames to find new hands (found hands are followed every frame)."""
    max_hands: int = Field(2, ge=1, le=4)
    """The most hands followed per stream."""
    types: list[Literal["box", "occlusion", "region", "area"]] = ["box"]
    """Zoo swappers: FaceFusion's face_mask_types, e.g. `box,occlusion,region`: `box` the blurred box (neural.blur), `occlusion` the occluder model, `region` the parser model limited to mask.regions, `area` the landmark areas of mask.areas (needs the built-in analyser's face mesh)."""
    areas: list[Literal["upper-face", "lower-face", "mouth"]] = ["upper-face", "lower-face", "mouth"]
    """With `area` in mask.types: the face areas the swap may paint, from the face's landmarks (FaceFusion's face_mask_areas)."""
    regions: list[Literal["skin", "left-eyebrow", "right-eyebrow", "left-eye", "right-eye", "glasses",
                          "nose", "mouth", "upper-lip", "lower-lip", "eyebrows", "eyes", "lips"]] = [
        "skin", "left-eyebrow", "right-eyebrow", "left-eye", "right-eye", "glasses", "nose", "mouth",
        "upper-lip", "lower-lip"]
    """With `region` in mask.types: the face parts the swap may paint (FaceFusion's face_mask_regions; `eyes`, `eyebrows`, `lips` name both sides)."""
    occluder: str = "xseg_1"
    """Zoo occluder for `occlusion` in mask.types: xseg_1, xseg_2 or xseg_3."""
    parser: str = "bisenet_resnet_18"
    """Zoo face parser for `region` in mask.types: bisenet_resnet_18 or bisenet_resnet_34."""

    @field_validator("types", "regions", "areas", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        # `--set mask.types=occlusion,region` arrives as one string; YAML presets give a list.
        return [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v


class EncodeConfig(_Section):
    codec: Literal["libx264"] = "libx264"
    """Video encoder for file outputs."""
    crf: int = Field(20, ge=0, le=51)
    """x264 constant rate factor: lower is better quality and larger files."""
    preset: Literal["ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                    "slower", "veryslow"] = "veryfast"
    """x264 speed/compression preset."""
    # x264 keeps frames in flight per thread (memory and latency): 16 covers a 4K file encode; a live
    # stream runs best on 1-2.
    threads: int = Field(0, ge=0, le=16)
    """Encoder threads (0: let x264 choose)."""
    # Under 0.25 s the stream is mostly keyframes (large, and x264's rate control starves the frames
    # between them); over 10 s a new viewer waits that long for a first picture and an HLS player
    # lags several times that. Live outputs only: files keep x264's own keyframe placement.
    gop_seconds: float = Field(1.0, ge=0.25, le=10.0)
    """Live outputs (RTMP, HLS): a keyframe every this many seconds of the output's timeline, whatever its frame rate; also the HLS segment length."""


class NeuralConfig(_Section):
    runner: Literal["auto", "tensorrt", "torch", "onnxruntime"] = "auto"
    """Inference backend for zoo models; `auto` picks TensorRT (once its start-up self-check passes), then PyTorch on CUDA, then ONNX Runtime."""
    precision: Literal["auto", "fp16", "fp32"] = "auto"
    """fp16 where the GPU has Tensor Cores (compute capability 7.0+), else fp32."""
    compile: bool = True
    """With the torch runner on a GPU: torch.compile the model (about 2x faster; the first frame of
    each batch size waits tens of seconds for compilation)."""
    max_batch: int = Field(4, ge=1, le=4)
    """Most faces per swap call (faces from several frames are batched together)."""
    embedder: str = "arcface_w600k_r50"
    """Zoo model that computes the source identity embedding."""
    detector: str = "builtin"
    """Face detector: `builtin` (BlazeFace + Face Mesh, offline) or a zoo detector (scrfd_2.5g, yoloface_8n)."""
    detect_every: int = Field(1, ge=1)
    """With a zoo detector: detect every N frames and carry the faces forward in between."""
    min_score: float = Field(0.5, ge=0.0, le=1.0)
    """With a zoo detector: minimum detection score."""
    finite_check: Literal["sync", "deferred"] = "sync"
    """fp16 overflow guard of the torch runner. `sync` checks every output and reruns a bad batch in
    fp32, which makes the host wait for the model each call; `deferred` zeroes non-finite values on
    the GPU and counts them a call later, without waiting (the live preset's choice)."""
    blur: float = Field(0.3, ge=0.0, le=1.0)
    """Paste-back box-mask blur, as FaceFusion's face_mask_blur."""
    download: bool = True
    """Download missing zoo models (needs the network and, the first time, --accept-licence)."""
    accept_licence: bool = False
    """Accept each model's licence without asking (for non-interactive runs)."""


class RuntimeConfig(_Section):
    max_wait_ms: float = Field(4.0, ge=0.0, le=1000.0)
    """Longest a face waits for others to fill a swap batch (multi-stream runtime); on a GPU, where
    frames are analysed together first, the longest a frame waits for others to fill an analysis
    batch."""
    swap_max_wait_ms: float | None = Field(None, ge=0.0, le=1000.0)
    """On a GPU: the longest an analysed frame's faces wait for others to fill a swap batch. None
    (the default): no wait, the frames analysed together are swapped together."""
    # A minute, as the API's per-stream budget_ms: a frame older than that is no longer live.
    budget_ms: float = Field(250.0, gt=0.0, le=60000.0)
    """Default latency budget of a stream: a frame's arrival to its encoding, at the p99."""
    # Three queues per stream, each frame a decoded picture (6 MB at 1080p): 16 is ~300 MB a stream,
    # and every queued frame is latency.
    queue_frames: int = Field(2, ge=1, le=16)
    """Frames each stage of a stream may hold; beyond that the oldest is dropped (live policy)."""
    analysis_thread: bool = True
    """On a GPU: face analysis runs in a thread of its own (on its own CUDA stream) beside the swap
    thread, so one batch's landmarks run while another's faces are swapped. False: both in one
    thread, in turn (the layout before; kept to compare the two in one benchmark run)."""
    # More than 4 frames ahead only adds memory and latency: the thread has its next frame at 2.
    analysis_depth: int = Field(1, ge=1, le=4)
    """Frames of one stream whose analysis may be asked for before the first comes back. At 1 a
    frame's analysis starts only after the previous frame's faces have come back to the stream
    (two hand-overs between threads on the way); at 2 the next frame already waits in the analysis
    thread's queue. Frames stay in order (one thread analyses them, one frame of a stream per
    batch); it matters when frames queue up (files, a stream behind), not at a live pace. Frames
    asked for ahead have left the input queue: a live stream that falls behind cannot drop them.
    `swapstream run` gained nothing from 2 on the 2-core CPU, on the H200, or on an H100 with
    `file_batch` (docs/runtime.md)."""
    analysis_priority: bool = False
    """On a GPU: the analysis thread's CUDA stream gets the device's highest scheduling priority, so
    its small kernels go ahead of the waiting blocks of a swap batch that runs beside them. For a
    file, whose analysis is the slowest stage on a GPU (docs/runtime.md). Off by default until a GPU
    benchmark shows what it does (`tools/device_check.sh run_priority`)."""
    # Waits 0.25 s at most (runtime.stream.FILE_BATCH_WAIT_S): a file's next frames are analysed in
    # milliseconds; a source that stalls longer (a network input to `run`) is not held up for it.
    file_batch: bool = True
    """A file (`swapstream run`: lossless) waits for analysed frames with up to `neural.max_batch`
    faces and swaps them in one call, as the frame loop before the runtime did; off, each frame goes
    to the swap as soon as it is analysed (what a live stream does: its frames are not held for
    others)."""
    # A stream holds at least three threads of its own plus its decoder's and encoder's: 256 streams
    # is over a thousand threads, past what one process schedules well.
    max_streams: int = Field(32, ge=1, le=256)
    """Most streams one process runs at once."""
    # Below 0.05 ms the interpreter spends more time handing the GIL over than running Python; above
    # Python's own 5 ms a thread that comes back from a GPU wait or a queue waits longer than a frame.
    switch_interval_ms: float = Field(1.0, ge=0.05, le=5.0)
    """How often the interpreter hands the GIL to a waiting thread while a runtime runs (Python's
    default is 5 ms). Every hand-over of a frame between the runtime's threads waits for it when
    another thread runs Python (runtime.priority); lower: shorter waits, more switching."""
    media_nice: int = Field(10, ge=0, le=19)
    """How much lower than the process's the OS priority of media threads is (Linux nice levels), so
    that the control API answers while streams saturate the machine (runtime.priority). `swapstream
    live`, which serves no API, runs its stream at 0: at 10 its threads would get a small share of
    the CPU against other programs at 0 (OBS beside it)."""
    degrade: bool = True
    """False: the degradation controller never steps a stream (a fixed quality: a stream over its
    budget stays at its full settings and its p99 shows it; what a capacity benchmark measures)."""
    # A controller that looks less than once a minute no longer follows the load.
    controller_interval: float = Field(0.5, gt=0.0, le=60.0)
    """Seconds between two looks of the degradation controller."""
    # A stream keeps the latencies of its last 600 frames since a change: more could never be reached.
    min_samples: int = Field(10, ge=1, le=600)
    """Frames since a stream's last change before the controller trusts its p99."""
    # The controller's hold times: an hour is already longer than any load change they smooth over.
    down_cooldown: float = Field(1.0, ge=0.0, le=3600.0)
    """Seconds after a change before a stream steps down again."""
    up_ratio: float = Field(0.6, gt=0.0, lt=1.0)
    """A stream steps back up only while its p99 is under this fraction of its budget..."""
    up_hold: float = Field(3.0, ge=0.0, le=3600.0)
    """... for this many seconds (hysteresis)."""
    gpu_high: float = Field(0.9, gt=0.0, le=1.0)
    """GPU utilisation above which the GPU counts as saturated."""
    gpu_high_for: float = Field(3.0, ge=0.0, le=3600.0)
    """Seconds of saturation before a stream on that GPU steps down."""
    gpu_low: float = Field(0.75, gt=0.0, lt=1.0)
    """Streams on a GPU step up only while its utilisation is under this."""
    # 16x fewer detections is already one every 16 x detect_every frames: new faces wait seconds.
    detect_less_factor: int = Field(4, ge=2, le=16)
    """The `detect_less` step runs the detector this many times less often."""
    low_res_scale: float = Field(0.5, gt=0.05, lt=1.0)
    """The `low_res` step swaps faces at this fraction of the resolution."""
    # An upload is held in memory while it is checked: 64 MiB is far above any face photo.
    upload_max_bytes: int = Field(8 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest source-face upload accepted by the control API."""
    # Decoded to RGB before the face is found: 8192 px a side is up to 200 MB.
    upload_max_side: int = Field(4096, ge=64, le=8192)
    """Largest width or height of an uploaded source image, in pixels."""
    allowed_hosts: list[HostPattern] = Field(list(DEFAULT_ALLOWED_HOSTS), max_length=256)
    """Where API streams may connect: name patterns (`*`: any public host, *.example.com), addresses and networks (10.0.0.0/8); private and link-local addresses only inside a listed network, metadata ones only listed themselves."""
    allowed_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field([], max_length=64)
    """Ports API streams may connect to besides their scheme's own (rtmp 1935, rtmps 443)."""
    insecure_tls: bool = False
    """Do not verify rtmps:// servers' certificates (labs only; logged as a warning); --insecure-tls sets it."""
    tls_ca_file: Path | None = None
    """CA certificates (PEM) rtmps:// servers are verified against; unset: $SSL_CERT_FILE, else the system's."""


class WatermarkConfig(_Section):
    # v1 stays the default until v2 meets its targets on every benchmark clip
    # (docs/responsible_use.md, "Watermark v2").
    scheme: Literal["v1", "v2"] = "v1"
    """Mark layout: `v1` block-DCT (survives re-encoding and rescaling); `v2` tiled and texture-masked (also survives crops, letterboxing, flips and small rotations; found over windows of frames; experimental)."""
    enabled: bool = True
    """Embed the invisible mark (SwapStream's product id and this run's stream id) in every frame SwapStream changes; off logs a warning."""
    strength: float = Field(1.0, ge=0.5, le=2.0)
    """Mark amplitude: 1.0 is about 2.3 levels RMS on luma (PSNR ~41 dB); higher survives harsher re-encoding and shows more."""
    stream_id: int | None = Field(None, ge=0, le=0xFFFFFFFF)
    """32-bit stream id the mark carries; unset: a fresh random id per run, printed in the run's log."""


class DisclosureConfig(_Section):
    label_live: bool = True
    """Draw the visible label on live outputs (RTMP, HLS, WebRTC); turning it off logs a warning."""
    label_files: bool = False
    """Draw it on file outputs too (files always carry the mark and the container's metadata)."""
    text: str = Field("AI-modified", pattern=r"^[ -~]{1,48}$")
    """The label's text: 1-48 printable ASCII characters."""
    position: Literal["bottom-left", "bottom-right", "top-left", "top-right"] = "bottom-left"
    """Corner the label sits in."""
    size: float = Field(0.04, ge=0.01, le=0.2)
    """Text height as a fraction of the frame height (at least 8 pixels)."""
    opacity: float = Field(0.6, ge=0.0, le=1.0)
    """Opacity of the black box behind the white text."""


class ProvenanceConfig(_Section):
    # "auto" so that a machine without a signing key still runs (the mark and the container tags
    # still disclose); true makes a missing or unusable key an error before any frame is processed.
    # Booleans rather than on/off strings: YAML reads on/off/yes/no as booleans anyway.
    c2pa: Literal["auto"] | bool = "auto"
    """C2PA Content Credentials on `run`'s MP4/MOV outputs: `auto` signs when a key and certificate are found, true requires them (an error otherwise), false never signs."""
    key: Path | None = None
    """Private key (PEM: EC P-256/P-384/P-521, RSA or Ed25519) that signs the manifest; unset: signer.key in the user data folder's swapstream/c2pa (`swapstream keys init`)."""
    cert: Path | None = None
    """Certificate chain (PEM) of that key: the signing certificate first, then its issuers, without the root; unset: chain.pem beside the default key."""
    # A timestamp keeps a manifest valid after the certificate expires; asking for one needs the
    # network at signing time, so it is opt-in.
    timestamp_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", max_length=2000)
    """RFC 3161 timestamp authority (http[s]://...) asked to countersign each manifest; unset: no timestamp, no network."""


class ConsentConfig(_Section):
    store: Path | None = None
    """Consent records file (default: $SWAPSTREAM_CONSENT_STORE, else the user data folder's swapstream/consent.json)."""


class WebRtcConfig(_Section):
    ice_servers: list[Annotated[str, Field(pattern=r"^stun:(?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$")]] = Field(
        [], max_length=4)
    """STUN servers (stun:HOST[:PORT]) for the server's and the pages' WebRTC sessions; empty: none, so no third party is contacted."""
    # A DNS name, or an IPv4/IPv6 literal (brackets optional); no port: any port is allowed.
    allowed_hosts: list[Annotated[str, Field(
        pattern=r"^(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.?)+$|^\[?[0-9A-Fa-f:.]+\]?$",
        max_length=253)]] = Field(["localhost", "127.0.0.1", "::1"], max_length=64)
    """Names a /whip or /whep request's Host header may carry (any port), besides serve's --host: others get 421 (DNS rebinding)."""
    cors_origins: list[Annotated[str, Field(pattern=r"^https?://[^/\s]+$", max_length=300)]] = Field(
        [], max_length=64)
    """Origins (https://site[:port]) whose pages may call /whip and /whep cross-origin; empty: no CORS headers (the pages are same-origin)."""
    connect_timeout_s: float = Field(15.0, ge=1.0, le=300.0)
    """Seconds a WHIP/WHEP session has to send its offer and reach ICE+DTLS 'connected'; after that it is dropped and its slot freed."""
    max_sdp_bytes: int = Field(64 * 1024, ge=4096, le=1024 * 1024)
    """Largest SDP offer accepted, in bytes (413 beyond); a browser's offer is 3-10 KB."""
    max_m_sections: int = Field(8, ge=1, le=64)
    """Most media sections (m= lines) in an offer (400 beyond); the pages and OBS send 2."""
    max_candidates: int = Field(64, ge=1, le=1024)
    """Most ICE candidates (a=candidate lines) in an offer (400 beyond): the server sends checks to each, and pairs them on its event loop."""


class Config(_Section):
    swapper: str = "mesh"
    """Which swapper replaces the faces: `mesh` (built in, no downloads) or a zoo swapper such as inswapper_128."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run: `auto` uses the GPU when CuPy and a CUDA device are usable, else the CPU."""
    decoder: Literal["auto", "nvdec", "cpu"] = "auto"
    """How `run` decodes on a GPU: `auto` uses NVDEC (PyNvVideoCodec) when it can decode the input, else PyAV on the host; `nvdec` refuses to run without it; `cpu` always uses PyAV."""
    models_dir: Path | None = None
    """Folder with model files (default: $SWAPSTREAM_MODELS_DIR or ~/.cache/swapstream/models)."""
    detector: DetectorConfig = DetectorConfig()
    """Face detection."""
    landmarks: LandmarkConfig = LandmarkConfig()
    """Face Mesh landmarks and tracking."""
    smoothing: SmoothingConfig = SmoothingConfig()
    """Temporal landmark smoothing."""
    mesh: MeshConfig = MeshConfig()
    """The built-in mesh swapper."""
    enhancer: str = "none"
    """Zoo swappers: a face enhancer run on the swapped face before its one paste-back (`none`, gfpgan_1.4, codeformer, gpen_bfr_512, restoreformer_plus_plus)."""
    enhancer_blend: float = Field(0.8, ge=0.0, le=1.0)
    """Share of the enhanced face in the result (FaceFusion's face_enhancer_blend / 100; it defaults to 80)."""
    mask: MaskConfig = MaskConfig()
    """What the swap may paint over: the occlusion mask."""
    neural: NeuralConfig = NeuralConfig()
    """Zoo models: runner, precision, batching, detector and downloads."""
    encode: EncodeConfig = EncodeConfig()
    """Video encoding: x264 settings of file outputs, and the keyframe interval of live outputs."""
    runtime: RuntimeConfig = RuntimeConfig()
    """The multi-stream runtime of `swapstream serve`: batching, budgets, degradation, uploads."""
    watermark: WatermarkConfig = WatermarkConfig()
    """The invisible mark in every frame SwapStream changes (`swapstream verify` finds it)."""
    disclosure: DisclosureConfig = DisclosureConfig()
    """The visible label."""
    provenance: ProvenanceConfig = ProvenanceConfig()
    """C2PA Content Credentials: the signed manifest on file outputs (`swapstream keys init`, `swapstream verify`)."""
    consent: ConsentConfig = ConsentConfig()
    """Where consent records for source faces are kept (`swapstream consent`)."""
    webrtc: WebRtcConfig = WebRtcConfig()
    """WHIP/WHEP of `swapstream serve`: ICE servers, allowed Host names and origins, offer limits."""


def _check_names(cfg: "Config", source: str) -> None:
    """Zoo names are validated against the registry, with the known names in the message."""
    from .engines.zoo import MODELS

    swappers = ["mesh"] + [n for n, m in MODELS.items() if m.kind == "swapper"]
    detectors = ["builtin"] + [n for n, m in MODELS.items() if m.kind == "detector"]
    embedders = [n for n, m in MODELS.items() if m.kind == "embedder"]
    occluders = [n for n, m in MODELS.items() if m.kind == "occluder"]
    parsers = [n for n, m in MODELS.items() if m.kind == "parser"]
    enhancers = ["none"] + [n for n, m in MODELS.items() if m.kind == "enhancer"]
    for key, value, known in (("swapper", cfg.swapper, swappers),
                              ("neural.detector", cfg.neural.detector, detectors),
                              ("neural.embedder", cfg.neural.embedder, embedders),
                              ("mask.occluder", cfg.mask.occluder, occluders),
                              ("mask.parser", cfg.mask.parser, parsers),
                              ("enhancer", cfg.enhancer, enhancers)):
        if value not in known:
            raise ConfigError(f"invalid value {value!r} for config key '{key}' in {source}: "
                              f"choose one of {', '.join(known)}")


def _format_error(err: ValidationError, source: str) -> str:
    e = err.errors()[0]
    key = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key '{key}' (value {e['input']!r}) in {source}"
    return f"invalid value {e['input']!r} for config key '{key}' in {source}: {e['msg']}"


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{key}': '{p}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """Split `key=value`; the value is read as YAML so that `true`, `3` and `0.5` get their types."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value, e.g. mesh.keep_eyes=true")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def resolve_preset(name_or_path: str | Path) -> Path:
    """A preset name from configs/ (`default`, `live`, ...) or a path to a YAML file."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    named = PRESETS_DIR / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    known = ", ".join(sorted(x.stem for x in PRESETS_DIR.glob("*.yaml"))) or "none"
    raise ConfigError(f"config preset '{name_or_path}' not found: give a YAML file path or one of: {known}")


def load_config(preset: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a Config from a preset (default: configs/default.yaml when present) and overrides."""
    tree: dict[str, Any] = {}
    source = "defaults"
    path = resolve_preset(preset) if preset is not None else PRESETS_DIR / "default.yaml"
    if path.is_file():
        source = str(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot read config '{path}': {first}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config '{path}' must be a mapping of keys to values, "
                              f"got {type(loaded).__name__}")
        tree = loaded
    try:
        Config.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None
    _check_names(Config.model_validate(tree), source)
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
        try:
            cfg = Config.model_validate(tree)
        except ValidationError as err:
            raise ConfigError(_format_error(err, f"--set {item}")) from None
        _check_names(cfg, f"--set {item}")
    return Config.model_validate(tree)


def describe(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every field, for `swapstream config` and the docs."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        key = prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(describe(ann, key + "."))
        else:
            rows.append((key, repr(field.default), field.description or ""))
    return rows
