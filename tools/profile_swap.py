"""Where the inswapper architecture spends its GPU time: torch.profiler over a few fp16 batches.

    python tools/profile_swap.py [--batch 4]     (on the GPU machine; prints the top kernels)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_test_models import inswapper  # noqa: E402

from swapstream.engines.torch_models import build_inswapper, onnx_initializers  # noqa: E402


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    m = build_inswapper(onnx_initializers(inswapper(width=128, blocks=6, seed=0)))
    m = m.to("cuda", dtype=torch.float16).to(memory_format=torch.channels_last).eval()
    t = torch.rand(args.batch, 3, 128, 128, device="cuda").contiguous(memory_format=torch.channels_last)
    s = torch.nn.functional.normalize(torch.randn(args.batch, 512, device="cuda"), dim=1)
    with torch.inference_mode():
        for _ in range(5):
            m(t, s)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                m(t, s)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
