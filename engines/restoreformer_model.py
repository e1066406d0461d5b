"""Native PyTorch module of the RestoreFormer++ face enhancer (`restoreformer_plus_plus`).

FaceFusion's `restoreformer_plus_plus.onnx` (vendor wzhouxiff, models-3.0.0; it replaced FaceFusion's
older `restoreformer.onnx` in its pull request 324) is RestoreFormer++ from wzhouxiff/RestoreFormerPlusPlus:
`VQVAEGANMultiHeadTransformer` of `RestoreFormer/modules/vqvae/vqvae_arch.py`, built as that
repository's `RestoreFormer/RestoreFormer.py` builds it for `RestoreFormer++` and as
`configs/RestoreFormerPlusPlus.yaml` configures it: n_embed 1024, embed_dim 256, z_channels 256, ch 64,
ch_mult (1, 2, 2, 4, 4, 8), num_res_blocks 2, attn_resolutions (16,), resolution 512, **head_size 4**
and **ex_multi_scale_num 1**. GFPGAN's `gfpgan/archs/restoreformer_arch.py` is the first RestoreFormer
(head_size 8, no multi-scale): its `inference_gfpgan.py` offers `--version RestoreFormer` only, and
RestoreFormer++'s weights do not fit it (they have cross-attention at 32 x 32 that it lacks).

The network, (N, 3, 512, 512) RGB in [-1, 1] -> the same (FaceFusion clips it to [-1, 1]):

- Encoder: conv_in 3 -> 64; six levels of two ResnetBlocks (GroupNorm(32, eps 1e-6), swish, 3x3 conv,
  twice, plus a 1x1 `nin_shortcut` where the width changes) at 512 ... 16, each level but the last
  ending in a stride-2 3x3 conv on a (0, 1, 0, 1) zero pad; the 16 x 16 level has a multi-head
  self-attention block after each ResnetBlock; a middle ResnetBlock, attention, ResnetBlock; then
  GroupNorm, swish, conv_out -> 256. Three features are kept for the decoder: the 32 x 32 level's
  output (`block_4`), the middle after its first ResnetBlock (`block_5_atten`) and after its second
  (`mid_atten`).
- Quantiser: quant_conv (1x1), then each of the 16 x 16 positions is replaced by its nearest entry
  of a 1024 x 256 codebook (squared Euclidean distance, first index on a tie).
- Decoder: post_quant_conv (1x1), conv_in -> 512, a middle ResnetBlock, attention, ResnetBlock; six
  levels of three ResnetBlocks from 16 up to 512 with nearest x2 upsampling + 3x3 conv between
  them; GroupNorm, swish, conv_out -> 3, no final activation. Each attention block of the decoder
  (the middle, and one after every ResnetBlock at 16 x 16 and, from ex_multi_scale_num 1, at
  32 x 32) is a cross-attention: its queries come from the encoder feature of that scale (through
  the block's norm2), its keys and values from the decoder's own feature (through norm1).

Parameter names are the repository's (`encoder.down.5.attn.0.q.weight`, `quantize.embedding.weight`,
...), so a RestoreFormer++ state dict loads as it is. The encoder's attention blocks never use their
norm2 (self-attention), so an exported ONNX file has no initializers for those six tensors; the
loader skips them. How many heads the attention has is in no weight's shape: this module assumes 4,
RestoreFormer++'s. Whether the released ONNX file kept these names as its initializer names is not
known here (it was never downloaded): if it did not, `build_restoreformer` says which weight is
missing and the file runs in ONNX Runtime instead.

Two deliberate departures, neither of which changes the fp32 result beyond rounding:

- The quantiser computes the original's distance, |z|^2 + |e|^2 - 2 z.e, always in fp32 (also when
  the module runs in fp16; about 67 M multiply-adds per face) and takes argmin + an embedding gather
  where the original multiplies a one-hot matrix with the codebook; both export to ONNX (ArgMin,
  Gather).
- Attention is `F.scaled_dot_product_attention` on (N, heads, HW, C/heads), the same arithmetic as
  the original's explicit softmax(q k^T / sqrt(C/heads)) v, with fused kernels on the GPU.

fp16 and the codes. The argmin is discontinuous: a position whose two nearest entries are nearly
equidistant can pick the other one under fp16's rounding of the encoder output, and a different code
changes the whole face, not one pixel. On the random test model (make_face_models'
`restoreformer_plus_plus`, seed 0; 64 faces of noise and smooth noise on the H200, fp32 with TF32
off as the reference), where the two nearest entries' distances differ by a median 0.3% only
(four photographs gave 0.7% flips in the second row):

| precision | positions whose code flips | faces beyond 1e-2 relative L2 (max) | ms/face, batch 4, eager |
|---|---|---|---|
| fp16 throughout, distances in fp16 | 4.6-4.8% | | |
| fp16 throughout, distances in fp32 (this module) | 0.46% | 46 of 64 (0.084) | 11.0 |
| encoder in fp32 on fp16-rounded weights | 0.29% | 30 of 64 (0.081) | |
| `mixed_precision`: fp32 encoder (TF32 off), fp16 decoder | none | none (0.0041) | 14.9 |

With fp32's codes forced into the fp16 module every face is within 4.1e-3. With TF32 convolutions
the mixed module took 11.0 ms/face too; its flips were not measured then. A trained codebook sits
closer to the encoder's outputs (training pulls them together), so the real model's rate is
probably lower, but it was not measured. torch.compile took the all-fp16 module to 3.8 ms/face at
batch 4 (8.6 at batch 1; about a minute to compile).

Torch is imported lazily so that importing this module never requires it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

RESTOREFORMER_SIZE = 512
RESTOREFORMER_HEADS = 4
"""RestoreFormer++'s head_size (RestoreFormer/RestoreFormer.py); the first RestoreFormer used 8."""
RESTOREFORMER_CH_MULT = (1, 2, 2, 4, 4, 8)
RESTOREFORMER_RES_BLOCKS = 2
RESTOREFORMER_ATTN_RESOLUTIONS = (16,)
RESTOREFORMER_EX_MULTI_SCALE = 1

# Names only RestoreFormer++ has (see the module docstring); `decoder.up.4.attn` is the 32 x 32
# cross-attention that ex_multi_scale_num 1 adds, so a first-RestoreFormer file is not taken for one.
_MARKERS = ("encoder.mid.attn_1.q.weight", "decoder.mid.attn_1.norm2.weight",
            "decoder.up.4.attn.0.q.weight", "quant_conv.weight", "post_quant_conv.weight",
            "quantize.embedding.weight")


def is_restoreformer(inits: dict[str, np.ndarray]) -> bool:
    return all(k in inits for k in _MARKERS)


def build_restoreformer(inits: dict[str, np.ndarray], heads: int = RESTOREFORMER_HEADS) -> Any:
    """A RestoreFormer++ module with the given initializers loaded (fp32, on the CPU). The widths
    (ch, z_channels, embed_dim, n_embed) are read from the weights' shapes; the layout is
    RestoreFormer++'s."""
    from .face_models import load_initializers

    n_embed, embed_dim = (int(d) for d in inits["quantize.embedding.weight"].shape)
    module = _classes()["RestoreFormerPlusPlus"](
        n_embed=n_embed, embed_dim=embed_dim, ch=int(inits["encoder.conv_in.weight"].shape[0]),
        z_channels=int(inits["quant_conv.weight"].shape[1]), head_size=heads)
    return load_initializers(module, inits, unused=unused_prefixes(module))


def new_restoreformer(ch: int = 64, n_embed: int = 1024, embed_dim: int = 256, z_channels: int = 256,
                      heads: int = RESTOREFORMER_HEADS) -> Any:
    """A RestoreFormer++ module with PyTorch's default random initialisation (for test models); the
    defaults are RestoreFormer++'s widths (a smaller `ch` makes a cheaper stand-in of the same layout)."""
    return _classes()["RestoreFormerPlusPlus"](n_embed=n_embed, embed_dim=embed_dim, ch=ch,
                                               z_channels=z_channels, head_size=heads).eval()


def unused_prefixes(module: Any) -> tuple[str, ...]:
    """State-dict prefixes the forward pass never reads: the norm2 of each encoder attention block
    (self-attention normalises only its input, with norm1). Exporters drop them."""
    attn = _classes()["MultiHeadAttnBlock"]
    return tuple(f"encoder.{name}.norm2." for name, m in module.encoder.named_modules()
                 if isinstance(m, attn))


@functools.cache
def _classes() -> Mapping[str, type]:
    """The module classes, defined lazily so that importing this file never requires torch; cached,
    so that `isinstance` against them (`_unused`) sees the classes the modules were built from."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def normalize(ch: int) -> nn.GroupNorm:
        return nn.GroupNorm(num_groups=32, num_channels=ch, eps=1e-6, affine=True)

    class ResnetBlock(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.norm1 = normalize(cin)
            self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
            self.norm2 = normalize(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
            if cin != cout:
                self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv1(F.silu(self.norm1(x)))
            h = self.conv2(F.silu(self.norm2(h)))  # dropout 0.0: an identity
            if hasattr(self, "nin_shortcut"):
                x = self.nin_shortcut(x)
            return x + h

    class MultiHeadAttnBlock(nn.Module):
        """Self-attention (`y` None) or cross-attention with queries from `y`, keys and values from
        `x`; residual on `x`. Channel c of a head-split tensor is head c // (C/heads), as in the
        original's reshape to (N, heads, C/heads, HW)."""

        def __init__(self, ch: int, heads: int) -> None:
            super().__init__()
            if ch % heads:
                raise ValueError(f"{ch} channels do not split into {heads} heads")
            self.heads = heads
            self.norm1 = normalize(ch)
            self.norm2 = normalize(ch)
            self.q = nn.Conv2d(ch, ch, 1)
            self.k = nn.Conv2d(ch, ch, 1)
            self.v = nn.Conv2d(ch, ch, 1)
            self.proj_out = nn.Conv2d(ch, ch, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
            h_ = self.norm1(x)
            y = h_ if y is None else self.norm2(y)
            q, k, v = self.q(y), self.k(h_), self.v(h_)
            n, c, hh, ww = q.shape

            def split(t: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) -> (N, heads, HW, C/heads)
                return t.reshape(n, self.heads, c // self.heads, hh * ww).transpose(2, 3)

            out = F.scaled_dot_product_attention(split(q), split(k), split(v))
            return x + self.proj_out(out.transpose(2, 3).reshape(n, c, hh, ww))

    class Downsample(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(ch, ch, 3, 2, 0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(F.pad(x, (0, 1, 0, 1)))  # no asymmetric padding in torch's conv

    class Upsample(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(ch, ch, 3, 1, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))

    def mid(ch: int, heads: int) -> nn.Module:
        m = nn.Module()
        m.block_1 = ResnetBlock(ch, ch)
        m.attn_1 = MultiHeadAttnBlock(ch, heads)
        m.block_2 = ResnetBlock(ch, ch)
        return m

    class MultiHeadEncoder(nn.Module):
        def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int,
                     attn_resolutions: tuple[int, ...], resolution: int, z_channels: int, heads: int) -> None:
            super().__init__()
            self.num_resolutions = len(ch_mult)
            self.num_res_blocks = num_res_blocks
            self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)
            res = resolution
            in_mult = (1, *ch_mult)
            self.down = nn.ModuleList()
            for i in range(self.num_resolutions):
                level = nn.Module()
                level.block = nn.ModuleList()
                level.attn = nn.ModuleList()
                cin, cout = ch * in_mult[i], ch * ch_mult[i]
                for _ in range(num_res_blocks):
                    level.block.append(ResnetBlock(cin, cout))
                    cin = cout
                    if res in attn_resolutions:
                        level.attn.append(MultiHeadAttnBlock(cout, heads))
                if i != self.num_resolutions - 1:
                    level.downsample = Downsample(cout)
                    res //= 2
                self.down.append(level)
            self.mid = mid(cout, heads)
            self.norm_out = normalize(cout)
            self.conv_out = nn.Conv2d(cout, z_channels, 3, 1, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            hs: dict[str, torch.Tensor] = {}
            h = self.conv_in(x)
            last = self.num_resolutions - 1
            for i, level in enumerate(self.down):
                for j in range(self.num_res_blocks):
                    h = level.block[j](h)
                    if len(level.attn) > 0:
                        h = level.attn[j](h)
                if i != last:
                    hs[f"block_{i}"] = h
                    h = level.downsample(h)
            h = self.mid.block_1(h)
            hs[f"block_{last}_atten"] = h
            h = self.mid.block_2(self.mid.attn_1(h))
            hs["mid_atten"] = h
            hs["out"] = self.conv_out(F.silu(self.norm_out(h)))
            return hs

    class MultiHeadDecoderTransformer(nn.Module):
        def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int,
                     attn_resolutions: tuple[int, ...], resolution: int, z_channels: int, heads: int) -> None:
            super().__init__()
            self.num_resolutions = len(ch_mult)
            self.num_res_blocks = num_res_blocks
            cin = ch * ch_mult[-1]
            res = resolution // 2 ** (self.num_resolutions - 1)
            self.conv_in = nn.Conv2d(z_channels, cin, 3, 1, 1)
            self.mid = mid(cin, heads)
            up: list[nn.Module] = []
            for i in reversed(range(self.num_resolutions)):
                level = nn.Module()
                level.block = nn.ModuleList()
                level.attn = nn.ModuleList()
                cout = ch * ch_mult[i]
                for _ in range(num_res_blocks + 1):
                    level.block.append(ResnetBlock(cin, cout))
                    cin = cout
                    if res in attn_resolutions:
                        level.attn.append(MultiHeadAttnBlock(cout, heads))
                if i != 0:
                    level.upsample = Upsample(cout)
                    res *= 2
                up.insert(0, level)  # up[i] is level i, as the original's prepend makes it
            self.up = nn.ModuleList(up)
            self.norm_out = normalize(cin)
            self.conv_out = nn.Conv2d(cin, 3, 3, 1, 1)

        def forward(self, z: torch.Tensor, hs: dict[str, torch.Tensor]) -> torch.Tensor:
            h = self.conv_in(z)
            h = self.mid.block_1(h)
            h = self.mid.attn_1(h, hs["mid_atten"])
            h = self.mid.block_2(h)
            for i in reversed(range(self.num_resolutions)):
                level = self.up[i]
                # The encoder feature of this scale: the middle one at the lowest, else the level's.
                key = f"block_{i}_atten" if f"block_{i}_atten" in hs else f"block_{i}"
                for j in range(self.num_res_blocks + 1):
                    h = level.block[j](h)
                    if len(level.attn) > 0:
                        h = level.attn[j](h, hs[key])
                if i != 0:
                    h = level.upsample(h)
            return self.conv_out(F.silu(self.norm_out(h)))

    class VectorQuantizer(nn.Module):
        def __init__(self, n_embed: int, embed_dim: int) -> None:
            super().__init__()
            self.embedding = nn.Embedding(n_embed, embed_dim)
            self.embedding.weight.data.uniform_(-1.0 / n_embed, 1.0 / n_embed)

        def indices(self, z: torch.Tensor) -> torch.Tensor:
            """(N, C, H, W) -> (N*H*W,) index of each position's nearest codebook entry."""
            zf = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]).float()
            e = self.embedding.weight.float()
            # The original's expression, in fp32 whatever the module's dtype (see the docstring).
            d = zf.square().sum(1, keepdim=True) + e.square().sum(1) - 2 * (zf @ e.t())
            return d.argmin(1)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            n, c, h, w = z.shape
            return self.embedding(self.indices(z)).reshape(n, h, w, c).permute(0, 3, 1, 2)

    class RestoreFormerPlusPlus(nn.Module):
        """wzhouxiff's VQVAEGANMultiHeadTransformer as RestoreFormer++ configures it: (N, 3, 512, 512)
        RGB in [-1, 1] -> the restored face, the same layout (fp32 out whatever the module's dtype)."""

        def __init__(self, n_embed: int = 1024, embed_dim: int = 256, ch: int = 64, z_channels: int = 256,
                     head_size: int = RESTOREFORMER_HEADS,
                     ex_multi_scale_num: int = RESTOREFORMER_EX_MULTI_SCALE,
                     ch_mult: tuple[int, ...] = RESTOREFORMER_CH_MULT,
                     num_res_blocks: int = RESTOREFORMER_RES_BLOCKS,
                     attn_resolutions: tuple[int, ...] = RESTOREFORMER_ATTN_RESOLUTIONS,
                     resolution: int = RESTOREFORMER_SIZE) -> None:
            super().__init__()
            self.encoder = MultiHeadEncoder(ch, ch_mult, num_res_blocks, attn_resolutions, resolution,
                                            z_channels, head_size)
            # ex_multi_scale_num 1: the decoder also cross-attends at twice the lowest resolution.
            dec_attn = tuple(attn_resolutions)
            for _ in range(ex_multi_scale_num):
                dec_attn = (dec_attn[0], dec_attn[-1] * 2)
            self.decoder = MultiHeadDecoderTransformer(ch, ch_mult, num_res_blocks, dec_attn, resolution,
                                                       z_channels, head_size)
            self.quantize = VectorQuantizer(n_embed, embed_dim)
            self.quant_conv = nn.Conv2d(z_channels, embed_dim, 1)
            self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)

        def mixed_precision(self, dtype: torch.dtype = torch.float16) -> RestoreFormerPlusPlus:
            """The decoder side (post_quant_conv and the decoder) in `dtype`; the encoder, quant_conv
            and the codebook stay as they are (fp32), so the codes are fp32's. An fp16 encoder picks
            another code at ~0.5% of the positions of the random test model, each flip moving the
            face by up to ~0.08 relative L2; this way none flipped in 64 faces (see the module
            docstring). In place; returns the module."""
            self.post_quant_conv.to(dtype)
            self.decoder.to(dtype)
            return self

        def codes(self, x: torch.Tensor) -> torch.Tensor:
            """(N, H/32 * W/32) codebook indices the quantiser picks for the input (for tests)."""
            x = x.to(self.encoder.conv_in.weight.dtype)
            z = self.quant_conv(self.encoder(x)["out"])
            return self.quantize.indices(z).reshape(x.shape[0], -1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hs = self.encoder(x.to(self.encoder.conv_in.weight.dtype))
            quant = self.quantize(self.quant_conv(hs["out"]))
            # One dtype throughout unless mixed_precision split it (then these casts are the split).
            dt = self.decoder.conv_in.weight.dtype
            hs = {k: v.to(dt) for k, v in hs.items()}
            return self.decoder(self.post_quant_conv(quant.to(dt)), hs).float()

    return MappingProxyType({"RestoreFormerPlusPlus": RestoreFormerPlusPlus, "MultiHeadAttnBlock": MultiHeadAttnBlock})
