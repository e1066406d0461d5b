"""Disclosure of what SwapStream made: the visible label, the invisible mark, and the log lines.

`Disclosure.apply(frame, swapped)` is called once for every frame a stream outputs (its output stage:
`runtime.stream`, or `runtime.gpu_stages.GpuCompose` on a GPU), on the frame's own array, NumPy or CuPy:
1. the label ("AI-modified" by default) is drawn when enabled for this kind of output: on by
   default for live outputs (RTMP, HLS, WebRTC), off by default for files, which carry the mark and
   the container's metadata and are usually edited further before anyone sees them;
2. the watermark goes into every frame that SwapStream changed: frames whose faces were swapped,
   and, when the label is on, every labelled frame.
Turning the label off for a live output, or the mark off for any output, logs a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from .config import Config, DisclosureConfig
from .kernels.label import blend_patch
from .watermark import PRODUCT_SWAPSTREAM, Payload, Watermarker
from .watermark_v2 import WatermarkerV2

log = logging.getLogger(__name__)

_FONT = cv2.FONT_HERSHEY_SIMPLEX
MIN_TEXT_PX = 8.0
"""Smallest label text height, in pixels: below it the label is not readable and is not drawn."""

# Metadata written into every output container that supports tags: the content is synthetic.
# MP4 and MOV keep `comment` (MP4 also `description`); MKV and FLV keep every key; MPEG-TS (HLS)
# keeps only `service_provider` and `service_name`. The digital source type is the IPTC term (the
# vocabulary C2PA uses) for real footage composited with the output of a trained model.
_DESCRIPTION = "Synthetic content: faces in this video were replaced by SwapStream (AI)."
_WATERMARK_NOTE = (" Every modified frame carries an invisible watermark; check it with "
                   "`swapstream verify`.")


def synthetic_tags(*, watermarked: bool) -> dict[str, str]:
    """The container tags for an output. They state only what was done: the synthetic-content
    declaration always, the watermark sentence only when the frames were marked (a tag that claims
    a mark which is not there would send a checker looking for proof that cannot be found)."""
    return {
        "comment": "AI-modified: faces swapped by SwapStream",
        "description": _DESCRIPTION + (_WATERMARK_NOTE if watermarked else ""),
        "digital_source_type": "http://cv.iptc.org/newscodes/digitalsourcetype/"
                               "compositeWithTrainedAlgorithmicMedia",
        "encoder_note": "swapstream",
        "service_provider": "SwapStream",
        "service_name": "AI-modified (faces swapped)",
    }


SYNTHETIC_TAGS = synthetic_tags(watermarked=True)
"""The tags of an output whose frames carry the mark (the default). Writers that know the job's
config take `Disclosure.tags` instead, which drops the watermark claim when the mark is off."""


@dataclass(frozen=True)
class LabelPatch:
    """A rendered label for one frame size: where it goes and how it blends (NumPy or CuPy)."""

    y0: int
    x0: int
    alpha: Any
    """(h, w) uint8 coverage 0..255 (text over a translucent box)."""
    premul: Any
    """(h, w, 1) uint8 colour already multiplied by coverage (white text over a black box)."""

    def to(self, xp: Any) -> "LabelPatch":
        return LabelPatch(self.y0, self.x0, xp.asarray(self.alpha), xp.asarray(self.premul))


def render_label(height: int, width: int, cfg: DisclosureConfig) -> LabelPatch | None:
    """Render `cfg.text` for a (height, width) frame: white text, anti-aliased, on a box of black at
    `cfg.opacity`, text height `cfg.size` of the frame height (at least 8 px), in the chosen corner
    with a margin of 2% of the shorter side. Shrunk to fit narrow frames; None when even 8 px text
    does not fit (frames under about 60 px)."""
    margin = max(2, round(0.02 * min(height, width)))
    (tw1, th1), _ = cv2.getTextSize(cfg.text, _FONT, 1.0, 2)
    scale = max(cfg.size * height, MIN_TEXT_PX) / th1
    pad_frac = 0.45                                           # box padding, in text heights
    need = (tw1 + 2 * pad_frac * th1) * scale
    if need > width - 2 * margin:
        scale *= (width - 2 * margin) / need                  # shrink to fit a narrow frame
    for _ in range(3):
        if th1 * scale < MIN_TEXT_PX - 1e-6:
            return None                                       # it would not be readable
        thickness = max(1, round(scale * 1.6))
        (tw, th), base = cv2.getTextSize(cfg.text, _FONT, scale, thickness)
        pad = max(2, round(pad_frac * th))
        bw, bh = tw + 2 * pad, th + base + 2 * pad
        if bw <= width - 2 * margin:
            break
        scale *= (width - 2 * margin) / bw                    # strokes and rounding: shrink again
    if bw > width - 2 * margin or bh > height - 2 * margin:
        return None
    text = np.zeros((bh, bw), np.uint8)
    cv2.putText(text, cfg.text, (pad, pad + th), _FONT, scale, 255, thickness, cv2.LINE_AA)
    t = text.astype(np.float32) / 255.0
    box = np.float32(cfg.opacity)
    # Text over the box: coverage 1 - (1 - box)(1 - text); colour white only where the text is.
    alpha = np.rint(255.0 * (1.0 - (1.0 - box) * (1.0 - t))).astype(np.uint8)
    premul = text[..., None].copy()
    top = cfg.position.startswith("top")
    left = cfg.position.endswith("left")
    y0 = margin if top else height - margin - bh
    x0 = margin if left else width - margin - bw
    return LabelPatch(y0, x0, alpha, premul)


def draw_label(frame: Any, patch: LabelPatch) -> None:
    """Blend a label patch into an RGB uint8 frame in place (NumPy or CuPy, same integer result):
    out = (x (255 - a) + p 255 + 127) // 255 (kernels/label.py)."""
    h, w = patch.alpha.shape
    blend_patch(frame[patch.y0:patch.y0 + h, patch.x0:patch.x0 + w], patch.alpha, patch.premul)


class Disclosure:
    """Label and mark for the frames of one job (see the module doc). Thread-safe for frames of
    different threads: the caches only gain entries."""

    def __init__(self, config: Config, *, live: bool) -> None:
        wm, dc = config.watermark, config.disclosure
        self.live = live
        self.label_cfg = dc
        self.label_on = dc.label_live if live else dc.label_files
        self.payload = Payload(PRODUCT_SWAPSTREAM, wm.stream_id) if wm.stream_id is not None \
            else Payload.new_stream()
        self.watermarker: Watermarker | WatermarkerV2 | None = None
        if wm.enabled:
            self.watermarker = (WatermarkerV2 if wm.scheme == "v2" else Watermarker)(self.payload, wm.strength)
        self.scheme = wm.scheme
        self.frames_marked = 0
        self.frames_labelled = 0
        self._patches: dict[tuple[int, int, int], LabelPatch | None] = {}
        if live and not self.label_on:
            log.warning("the visible 'AI-modified' label is OFF for this live output "
                        "(disclosure.label_live=false): viewers will not see that faces are swapped. "
                        "Disclose it another way.")
        if not wm.enabled:
            log.warning("the invisible watermark is OFF (watermark.enabled=false): the output cannot "
                        "be checked with `swapstream verify`.")

    def label_patch(self, frame: Any) -> LabelPatch | None:
        """The label rendered for this frame's size, on the frame's device (None: too small)."""
        h, w = int(frame.shape[0]), int(frame.shape[1])
        on_gpu = type(frame).__module__.startswith("cupy")
        device = -1
        if on_gpu:
            import cupy

            device = cupy.cuda.runtime.getDevice()
        key = (h, w, device)
        if key not in self._patches:
            patch = render_label(h, w, self.label_cfg)
            if patch is not None and on_gpu:
                import cupy

                patch = patch.to(cupy)
            self._patches[key] = patch
        return self._patches[key]

    def apply(self, frame: Any, swapped: bool) -> bool:
        """Label (when on) and mark (when the frame was changed) an RGB uint8 frame in place;
        returns whether it was marked."""
        labelled, marked = self._disclose(frame, swapped)
        self.frames_labelled += labelled
        self.frames_marked += marked
        return marked

    def _disclose(self, frame: Any, swapped: bool) -> tuple[bool, bool]:
        labelled = False
        if self.label_on:
            patch = self.label_patch(frame)
            if patch is not None:
                draw_label(frame, patch)
                labelled = True
        if self.watermarker is not None and (swapped or labelled):
            self.watermarker.embed(frame)
            return labelled, True
        return labelled, False

    def warm_up(self, scratch: Any) -> None:
        """Build what `apply` needs for frames of `scratch`'s size and device (the label's patch, the
        mark's pattern or tables, on the GPU their upload and the kernels' first launch) by marking
        `scratch`, a frame the caller throws away; nothing is counted. On the GPU the kernels are
        queued on the current stream: the caller waits for them (`StreamPipeline._warm_disclosure` does)."""
        self._disclose(scratch, True)

    @property
    def tags(self) -> dict[str, str]:
        """The container tags for this job's outputs (`synthetic_tags`): they mention the watermark
        only when it is on."""
        return synthetic_tags(watermarked=self.watermarker is not None)

    def describe(self) -> list[tuple[str, str]]:
        """(name, value) lines for the run's log and summary."""
        where = "live" if self.live else "file"
        label = (f"on ('{self.label_cfg.text}', {self.label_cfg.position})" if self.label_on
                 else f"off for {where} outputs")
        scheme = ", scheme v2" if self.scheme == "v2" else ""
        mark = f"{self.payload}{scheme} (swapstream verify)" if self.watermarker is not None else "OFF"
        return [("watermark", mark), ("label", label)]
