#!/usr/bin/env python3
"""FlashInfer 0.6.x's SM90 fp4 weight interleave: its CUDA kernel on a GPU vs the CPU transcription
`release_standins.sm90_fp4_weights_0_6` that the tensor records of vLLM 0.22.0-0.28.0 use.

    python tools/golden/device_sm90_fp4_0_6.py payload WHEEL_OR_CU   # prints the device command
    (run that command on the lent GPU machine; it writes $OUT/sm90_0_6_14.json)
    python tools/golden/device_sm90_fp4_0_6.py check REPORT.json      # CPU transcription vs the GPU

`payload` cuts `interleave_fp4_weights_for_sm90_mixed_gemm_kernel` verbatim out of the wheel's
data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu (it uses
nothing but uint8_t) and packs it with DRIVER (below) into one shell command (the GPU machine gets
no files of this worktree). DRIVER compiles the kernel with nvcc behind a launcher with the wheel's
launch configuration (`<<<1024, dim3(32, 32)>>>`, as `interleave_fp4_weights_for_sm90_mixed_gemm`),
runs it once per random [rows, cols/2] uint8 weight (torch.Generator seed 606, in SHAPES order) and
records the input and output sha256. `check` regenerates the inputs and compares the transcription's
output digests. Shapes whose cols are not a multiple of 64 leave bytes the kernel never writes
(FlashInfer allocates with torch.empty): they are skipped, and no record uses such a shape.

The committed result, tools/golden/device_sm90_fp4_0_6.json: FlashInfer 0.6.14's kernel on an
NVIDIA H200 (torch 2.11.0+cu130, nvcc 13.0) equals the transcription for every full shape, up to
gpt-oss size (1440 x 2880).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

KERNEL_FILE = "flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu"
SHAPES = [(16, 32), (32, 64), (48, 96), (192, 80), (256, 128), (384, 80), (320, 64), (512, 1440), (1440, 1440)]
DRIVER = r"""import torch,ctypes,subprocess,hashlib,json,os,sys
K=open("k.cu").read()
open("/tmp/k.cu","w").write('#include <cstdint>\n#include <cuda_runtime.h>\n'+K+'\nextern "C" int run(uint8_t*a,uint8_t*b,int r,int c){dim3 bl(32,32);interleave_fp4_weights_for_sm90_mixed_gemm_kernel<<<1024,bl>>>(a,b,r,c);return (int)cudaDeviceSynchronize();}\n')
subprocess.run(["nvcc","-O2","-shared","-Xcompiler","-fPIC","-arch=sm_90","-o","/tmp/k.so","/tmp/k.cu"],check=True)
L=ctypes.CDLL("/tmp/k.so");g=torch.Generator().manual_seed(606);R=[]
for n,kb in [(16,32),(32,64),(48,96),(192,80),(256,128),(384,80),(320,64),(512,1440),(1440,1440)]:
 w=torch.randint(0,256,(n,kb),dtype=torch.uint8,generator=g);d=w.cuda();o=torch.zeros_like(d)
 rc=L.run(ctypes.c_void_p(d.data_ptr()),ctypes.c_void_p(o.data_ptr()),n,2*kb)
 R.append(dict(rows=n,cols=2*kb,rc=rc,input_sha256=hashlib.sha256(w.numpy().tobytes()).hexdigest(),gpu_sha256=hashlib.sha256(o.cpu().numpy().tobytes()).hexdigest()))
r=dict(kernel_sha256=hashlib.sha256(K.encode()).hexdigest(),gpu=torch.cuda.get_device_name(),torch=torch.__version__,nvcc=subprocess.run(["nvcc","--version"],capture_output=True,text=True).stdout.split("\n")[-2],results=R)
json.dump(r,open(os.environ["OUT"]+"/sm90_0_6_14.json","w"),indent=1);print(json.dumps(r)[:600])
"""  # noqa: E501  (run verbatim on the GPU machine)


def kernel_source(text: str) -> str:
    """`interleave_fp4_weights_for_sm90_mixed_gemm_kernel`, verbatim, from the .cu text."""
    start = text.index("__global__ void interleave_fp4_weights_for_sm90_mixed_gemm_kernel")
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[start:i]


def payload(source: Path) -> str:
    text = zipfile.ZipFile(source).read(KERNEL_FILE).decode() if source.suffix == ".whl" else source.read_text()
    kernel = kernel_source(text)
    if "int mma_id = lane_id / 8;" not in kernel:
        raise SystemExit(f"{source}: not the FlashInfer 0.6.x kernel")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in (("k.cu", kernel), ("drv.py", DRIVER)):
            info = tarfile.TarInfo(name)
            info.size = len(data.encode())
            tar.addfile(info, io.BytesIO(data.encode()))
    blob = base64.b64encode(buf.getvalue()).decode()
    return (
        "export PATH=$PATH:/usr/local/cuda/bin; mkdir -p /tmp/w && cd /tmp/w && "
        f"echo {blob} | base64 -d | tar xJ && python3 drv.py"
    )


def check(report_path: Path) -> int:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from release_standins import sm90_fp4_weights_0_6

    report = json.loads(report_path.read_text())
    g = torch.Generator().manual_seed(606)
    compared = 0
    for result, (rows, half) in zip(report["results"], SHAPES, strict=True):
        w = torch.randint(0, 256, (rows, half), dtype=torch.uint8, generator=g)
        assert hashlib.sha256(w.numpy().tobytes()).hexdigest() == result["input_sha256"], "inputs differ"
        if (2 * half) % 64:
            continue
        ours = hashlib.sha256(sm90_fp4_weights_0_6(w).numpy().tobytes()).hexdigest()
        if result["rc"] != 0 or ours != result["gpu_sha256"]:
            print(f"{rows}x{2 * half}: the transcription differs from the GPU")
            return 1
        compared += 1
    print(f"{compared} shapes: the transcription equals FlashInfer's kernel on {report['gpu']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("payload", "check"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "payload":
        print(payload(Path(sys.argv[2])))
        sys.exit(0)
    sys.exit(check(Path(sys.argv[2])))
