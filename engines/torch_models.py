"""Native PyTorch modules for the zoo's known architectures, with weights read from the ONNX files.

A module that onnx2torch converts from ONNX ran 4x slower than a native one and could not be
captured in a CUDA graph, because its shape ops synchronise with the host (on the H200, for an
inswapper-shaped model in fp16: 19-21 ms per face eager, against 5.1 ms for the native module and
2.04 ms once that was captured). So known architectures get hand-written modules that load the ONNX
initializers by name, as the public inswapper ports do. onnx2torch stays a slow fallback for unknown
models (`engines/torch_runner.py`).

InSwapper (its contract and architecture: docs/neural.md, "Model contracts"): initializer names are
those of the released inswapper_128.onnx; the synthetic models from tools/make_test_models.py use the
same names, so one loader serves both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Initializer names of inswapper_128.onnx, per layer: (weight, bias).
INSWAPPER_ENCODER = [("onnx::Conv_833", "onnx::Conv_834"), ("onnx::Conv_836", "onnx::Conv_837"),
                     ("onnx::Conv_839", "onnx::Conv_840"), ("onnx::Conv_842", "onnx::Conv_843")]
INSWAPPER_DECODER = [("onnx::Conv_845", "onnx::Conv_846"), ("onnx::Conv_848", "onnx::Conv_849"),
                     ("onnx::Conv_851", "onnx::Conv_852"), ("up0.1.weight", "up0.1.bias")]


def onnx_initializers(model: Any) -> dict[str, np.ndarray]:
    """Name -> array of every initializer of an `onnx.ModelProto`, in graph order."""
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def is_inswapper(inits: dict[str, np.ndarray]) -> bool:
    return all(w in inits for w, _ in INSWAPPER_ENCODER + INSWAPPER_DECODER) and \
        "styles.0.conv1.1.weight" in inits


def emap_of(model: Any) -> np.ndarray:
    """inswapper's `emap`: the graph's last initializer, a (512, 512) matrix (docs/neural.md, "Swappers")."""
    from onnx import numpy_helper

    last = model.graph.initializer[-1]
    arr = numpy_helper.to_array(last).astype(np.float32)
    if arr.shape != (512, 512):
        raise ValueError(f"the last initializer '{last.name}' has shape {arr.shape}, not (512, 512): "
                         f"this is not an inswapper model")
    return arr


def build_inswapper(inits: dict[str, np.ndarray], fused_norm: bool = True) -> Any:
    """An `InSwapper` module with the given initializers loaded (fp32, on the CPU).

    `fused_norm` uses PyTorch's instance norm kernel (fp32 accumulation inside); False computes the
    statistics with explicit fp32 tensor ops (slower; kept to compare against)."""
    import torch

    width = int(inits[INSWAPPER_ENCODER[0][0]].shape[0])
    blocks = 0
    while f"styles.{blocks}.conv1.1.weight" in inits:
        blocks += 1
    m = _inswapper_class()(width, blocks, fused_norm)
    sd: dict[str, Any] = {}
    for i, (w, b) in enumerate(INSWAPPER_ENCODER):
        sd[f"enc.{i}.weight"], sd[f"enc.{i}.bias"] = inits[w], inits[b]
    for i, (w, b) in enumerate(INSWAPPER_DECODER):
        sd[f"dec.{i}.weight"], sd[f"dec.{i}.bias"] = inits[w], inits[b]
    for i in range(blocks):
        for part in ("conv1", "conv2"):
            sd[f"blocks.{i}.{part}.weight"] = inits[f"styles.{i}.{part}.1.weight"]
            sd[f"blocks.{i}.{part}.bias"] = inits[f"styles.{i}.{part}.1.bias"]
        for j in (1, 2):
            w = inits[f"styles.{i}.style{j}.linear.weight"]
            out_f = 2 * 8 * width
            # Gemm with transB=1 stores (out, in) like torch; a MatMul stores (in, out).
            sd[f"blocks.{i}.style{j}.weight"] = w if w.shape[0] == out_f else w.T
            sd[f"blocks.{i}.style{j}.bias"] = inits[f"styles.{i}.style{j}.linear.bias"]
    m.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()})
    return m.eval()


def _inswapper_class() -> type:
    """Defined lazily so that importing this module never requires torch."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def instance_norm_fp32(x: torch.Tensor) -> torch.Tensor:
        # The model's eps of 1e-8 is below fp16's resolution (docs/neural.md, "The inswapper_128
        # architecture"): statistics in fp32.
        x32 = x.float()
        mean = x32.mean(dim=(2, 3), keepdim=True)
        var = (x32 - mean).square().mean(dim=(2, 3), keepdim=True)
        return ((x32 - mean) * torch.rsqrt(var + 1e-8)).to(x.dtype)

    def instance_norm_fused(x: torch.Tensor) -> torch.Tensor:
        # PyTorch's instance norm runs batch norm's CUDA kernel, which accumulates half inputs in
        # float and adds eps in float, so the 1e-8 survives; one kernel instead of about eight.
        return F.instance_norm(x, eps=1e-8)

    def nhwc(x: torch.Tensor) -> torch.Tensor:
        # Reflection padding returns NCHW; cuDNN's fast fp16 convolutions want NHWC. Converting a
        # 2 MB activation costs ~2 us; letting cuDNN convert around the convolution costs more.
        return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x

    class AdaINBlock(nn.Module):
        def __init__(self, ch: int, fused_norm: bool) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(ch, ch, 3)
            self.conv2 = nn.Conv2d(ch, ch, 3)
            self.style1 = nn.Linear(512, 2 * ch)
            self.style2 = nn.Linear(512, 2 * ch)
            self.ch = ch
            self.norm = instance_norm_fused if fused_norm else instance_norm_fp32

        def _round(self, x: torch.Tensor, conv: nn.Conv2d, style: nn.Linear,
                   latent: torch.Tensor) -> torch.Tensor:
            y = self.norm(conv(nhwc(F.pad(x, (1, 1, 1, 1), mode="reflect"))))
            s = style(latent)
            gamma, beta = s[:, :self.ch, None, None], s[:, self.ch:, None, None]
            return torch.addcmul(beta, y, gamma)

        def forward(self, x: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
            y = F.relu(self._round(x, self.conv1, self.style1, latent))
            return x + self._round(y, self.conv2, self.style2, latent)

    class InSwapper(nn.Module):
        """inswapper_128: encoder, AdaIN residual blocks driven by the source latent, decoder."""

        def __init__(self, width: int = 128, blocks: int = 6, fused_norm: bool = True) -> None:
            super().__init__()
            w = width
            self.enc = nn.ModuleList([nn.Conv2d(3, w, 7), nn.Conv2d(w, 2 * w, 3, padding=1),
                                      nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1),
                                      nn.Conv2d(4 * w, 8 * w, 3, stride=2, padding=1)])
            self.blocks = nn.ModuleList([AdaINBlock(8 * w, fused_norm) for _ in range(blocks)])
            self.dec = nn.ModuleList([nn.Conv2d(8 * w, 4 * w, 3, padding=1),
                                      nn.Conv2d(4 * w, 2 * w, 3, padding=1),
                                      nn.Conv2d(2 * w, w, 3, padding=1), nn.Conv2d(w, 3, 7)])

        def forward(self, target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
            dt = self.enc[0].weight.dtype
            x = target.to(dt)
            latent = source.to(dt)
            x = F.leaky_relu(self.enc[0](nhwc(F.pad(x, (3, 3, 3, 3), mode="reflect"))), 0.2)
            for conv in self.enc[1:]:
                x = F.leaky_relu(conv(x), 0.2)
            for blk in self.blocks:
                x = blk(x, latent)
            for conv in self.dec[:2]:
                x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
                x = F.leaky_relu(conv(x), 0.2)
            x = F.leaky_relu(self.dec[2](x), 0.2)
            x = torch.tanh(self.dec[3](nhwc(F.pad(x, (3, 3, 3, 3), mode="reflect"))))
            return ((x + 1.0) * 0.5).float()

    return InSwapper
