"""One-off: CPU time (thread_time, best of 5) of 50 x forward + inverse of every tensor of three
MXFP4 layouts at tiny sizes (hidden = intermediate = 256, 2 experts), where per-call costs show:
the price of reading torch/numpy through mxconvert/lazy_import.py. Run once per checkout:

    python bench/results/session5/layout_call_overhead.py /tmp/notorch-before
    python bench/results/session5/layout_call_overhead.py $PWD
"""

import sys
import time

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402

from mxconvert.formats.mxfp4.canonical import canonical_specs  # noqa: E402
from mxconvert.layouts import resolve_layout  # noqa: E402
from mxconvert.target.backends import Mxfp4Backend as B  # noqa: E402
from mxconvert.target.profiles import get_profile  # noqa: E402
from mxconvert.target.revisions import REVISIONS  # noqa: E402

rev = REVISIONS["vllm-0.33"]
res = {}
for backend, prof in ((B.FLASHINFER_TRTLLM_MXFP4_BF16, "b200"), (B.TRITON, "h100"), (B.MARLIN, "a100")):
    layout = resolve_layout(backend, rev, get_profile(prof))
    hp, ip = rev.round_up(backend, get_profile(prof).platform, 256, 256)
    specs = canonical_specs(2, hp, ip)
    g = torch.Generator().manual_seed(0)
    xs = {
        n: (
            torch.randint(0, 250, s, dtype=torch.uint8, generator=g)
            if str(d).endswith("uint8")
            else torch.randn(s, generator=g).to(torch.bfloat16)
        )
        for n, (d, s) in specs.items()
    }
    for n, t in layout.tensors.items():
        t.forward(xs[n])
    best = 1e9
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(50):
            for n, t in layout.tensors.items():
                y = t.forward(xs[n])
                t.inverse(y, specs[n][1], specs[n][0])
        best = min(best, time.thread_time() - t0)
    res[backend.value] = round(best, 4)
print(sys.argv[1], res)
