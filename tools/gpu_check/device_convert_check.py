"""`--device cuda` writes the CPU's bytes, for every backend and profile; `verify --device cuda` agrees.

    python3 tools/gpu_check/device_convert_check.py --device cuda --json-out result.json
    python3 tools/gpu_check/device_convert_check.py --device cpu-portable   # the same code on the host

For every checkpoint in examples/ (MXFP4 and NVFP4) and a synthetic gpt-oss-size layer
(bench/synthetic.py, H = I = 2880) -- and, with --nvfp4-big, a synthetic NVFP4 layer of
Qwen3-30B-A3B size (examples/make_tiny_nvfp4_moe.py) -- every (runtime revision, built-in profile,
--backend request, TP) that mxconvert accepts is planned; targets whose layout and geometry are the
same (say b200 and b300 for one backend) run once. Each distinct target is converted with the
default host path and with DEVICE; every output file and every tensor in it is compared byte for
byte (and the two manifests' file digests), and the DEVICE artifact is verified with `verify` on
DEVICE. A planted one-bit change must then be found by `verify` on DEVICE as well. Exit 1 on any
difference. Uses only mxconvert's Python API (torch, safetensors, numpy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

from mxconvert.artifact.manifest import read_manifest  # noqa: E402
from mxconvert.core.errors import MxconvertError  # noqa: E402
from mxconvert.formats.registry import format_of, open_model  # noqa: E402
from mxconvert.layouts.device import Compute, compute_for  # noqa: E402
from mxconvert.pipeline.convert import execute  # noqa: E402
from mxconvert.pipeline.plan import make_plan  # noqa: E402
from mxconvert.pipeline.verify import verify_artifact  # noqa: E402
from mxconvert.selection import Deployment  # noqa: E402
from mxconvert.selection.vocabulary import backend_rows  # noqa: E402
from mxconvert.target.profiles import BUILTIN_PROFILES  # noqa: E402
from mxconvert.target.revisions import REVISIONS  # noqa: E402

#: Deployment switches that change the selected backend (activation dtype, Marlin's input dtype, the
#: batched activation format, the env switches of older revisions): with them every backend that has
#: a layout is reached on some built-in profile.
VARIANTS: tuple[dict, ...] = (
    {},
    {"activation": "mxfp8"},
    {"marlin_input_dtype": "fp8"},
    {"batched": True},
    {"env": {"VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1"}},
    {"env": {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}},
    {"env": {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": "1"}},
    {"env": {"VLLM_USE_FLASHINFER_MOE_FP4": "1"}},
)

#: Fields of a plan's target that name the device, not the bytes (the layout and sizes stay).
NAMING_FIELDS = ("profile", "platform", "capability", "gfx", "device", "requested_backend", "kernel_class")


def _device(name: str) -> Compute:
    if name == "cpu-portable":  # the device path run on the host (what the CPU tests do)
        return Compute(torch.device("cpu"))
    return compute_for(name)


def _targets(ckpt, tps: tuple[int, ...]):
    """(label, plan, key) for every target mxconvert accepts for `ckpt`; key = what decides the bytes."""
    fmt = format_of(ckpt).name
    requests: dict[str, list[str]] = {}
    for row in backend_rows():
        if row["format"] == fmt:
            requests.setdefault(row["revision"], ["auto"]).append(row["backend"])
    for revision_name, backends in requests.items():
        revision = REVISIONS[revision_name]
        for profile in BUILTIN_PROFILES:
            for backend in dict.fromkeys(backends):
                for tp in tps:
                    for variant in VARIANTS:
                        try:
                            plan = make_plan(ckpt, profile, revision, Deployment(tp=tp, **variant), backend)
                        except MxconvertError:
                            continue  # this profile or shape cannot run that backend: convert refuses it too
                        target = {k: v for k, v in plan.target().items() if k not in NAMING_FIELDS}
                        key = json.dumps(target, sort_keys=True)
                        extra = " ".join(f"{k}={v}" for k, v in variant.items())
                        yield f"{revision_name} {profile.name} {backend} tp{tp} {extra}".strip(), plan, key


def _file_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.safetensors"))
    }


def _compare(host: Path, dev: Path) -> tuple[int, list[str]]:
    """(tensors compared, differences) between two artifacts: every tensor byte for byte, every file's
    sha256, and the manifests (identical but for nothing: the device is not recorded)."""
    problems = []
    hm, dm = read_manifest(host), read_manifest(dev)
    if hm != dm:
        problems.append("manifests differ")
    hd, dd = _file_digests(host), _file_digests(dev)
    if hd != dd:
        problems.append(f"file digests differ: {sorted(k for k in hd if hd.get(k) != dd.get(k))[:5]}")
    count = 0
    for rel in sorted(hd):
        with safe_open(str(host / rel), "pt") as a, safe_open(str(dev / rel), "pt") as b:
            if sorted(a.keys()) != sorted(b.keys()):
                problems.append(f"{rel}: tensor names differ")
                continue
            for key in a.keys():
                x, y = a.get_tensor(key), b.get_tensor(key)
                count += 1
                if (
                    x.dtype != y.dtype
                    or x.shape != y.shape
                    or not torch.equal(
                        x.contiguous().view(-1).view(torch.uint8), y.contiguous().view(-1).view(torch.uint8)
                    )
                ):
                    problems.append(f"{rel}: {key} differs")
    return count, problems


def _sync(compute: Compute) -> None:
    if compute.device.type == "cuda":
        torch.cuda.synchronize(compute.device)


def _check_source(
    label: str, src: Path, compute: Compute, tmp: Path, rows: list, tps: tuple[int, ...], verify_all: bool
) -> None:
    ckpt = open_model(str(src))
    seen: set[str] = set()
    tried = 0
    for name, plan, key in _targets(ckpt, tps):
        tried += 1
        if key in seen:
            continue
        seen.add(key)
        host, dev = tmp / "host", tmp / "dev"
        shutil.rmtree(host, ignore_errors=True)
        shutil.rmtree(dev, ignore_errors=True)
        t0 = time.perf_counter()
        execute(plan, host)
        t1 = time.perf_counter()
        execute(plan, dev, device=compute)
        _sync(compute)
        t2 = time.perf_counter()
        tensors, problems = _compare(host, dev)
        verified = None
        if verify_all:
            report = verify_artifact(dev, str(src), device=compute)
            verified = report.ok
            if not report.ok:
                problems.append(f"verify on {compute.device}: {[p.message for p in report.problems[:3]]}")
        t3 = time.perf_counter()
        row = {
            "source": label,
            "target": name,
            "backend": plan.selection.backend.value,
            "layout": plan.layout.describe().get("kind"),
            "tensors": tensors,
            "bytes": sum(p.stat().st_size for p in dev.rglob("*.safetensors")),
            "host_s": round(t1 - t0, 3),
            "device_s": round(t2 - t1, 3),
            "verify_s": round(t3 - t2, 3) if verified is not None else None,
            "identical": not [p for p in problems if not p.startswith("verify")],
            "verified": verified,
            "problems": problems,
        }
        rows.append(row)
        print(
            f"{'OK ' if not problems else 'BAD'} {label:32} {name:58} {row['backend']:34} {tensors:4} tensors "
            f"host {row['host_s']:6.2f} s {compute.device.type} {row['device_s']:6.2f} s"
            + (f" verify {row['verify_s']:6.2f} s" if verified is not None else "")
            + (f"  {problems}" if problems else ""),
            flush=True,
        )
    print(f"   {label}: {tried} accepted targets, {len(seen)} distinct", flush=True)


def _planted_change_is_found(src: Path, compute: Compute, tmp: Path) -> bool:
    """Flip one bit of a stored expert weight: verify on the device must report that tensor."""
    ckpt = open_model(str(src))
    plan = next(p for _, p, _ in _targets(ckpt, (1,)))
    out = tmp / "planted"
    shutil.rmtree(out, ignore_errors=True)
    execute(plan, out, device=compute)
    rank = read_manifest(out)["ranks"][0]
    key = next(k for k, v in rank["tensors"].items() if v["name"] in ("w2_weight", "w13_weight"))
    file = out / rank["tensors"][key]["file"]
    with open(file, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
        begin = json.loads(f.read(header))[key]["data_offsets"][0]
    data = bytearray(file.read_bytes())
    data[8 + header + begin + 3] ^= 0x04
    file.write_bytes(bytes(data))
    report = verify_artifact(out, str(src), device=compute)
    found = any(p.tensor == key and p.kind in ("tensor", "padding") for p in report.problems)
    print(
        f"{'OK ' if found else 'BAD'} planted one-bit change in {key}: verify on {compute.device} reports "
        f"{[p.kind for p in report.problems]}",
        flush=True,
    )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu-portable (the device path on the host)")
    parser.add_argument(
        "--big-experts",
        type=int,
        default=32,
        help="experts of the synthetic gpt-oss-size layer (32: 20b, 128: 120b; 0: skip)",
    )
    parser.add_argument(
        "--nvfp4-big",
        type=int,
        default=0,
        help="experts of a synthetic NVFP4 layer, H=2048, I=768 (Qwen3-30B-A3B size; 0: skip)",
    )
    parser.add_argument("--examples", default="all", help="comma list of examples/ folders, or all, or none")
    parser.add_argument("--tmp", type=Path)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    compute = _device(args.device)
    info = {
        "device": str(compute.device),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(compute.device) if compute.device.type == "cuda" else None,
    }
    print(json.dumps(info), flush=True)
    rows: list[dict] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.tmp) as name:
        tmp = Path(name)
        examples = sorted(p for p in (ROOT / "examples").iterdir() if (p / "config.json").is_file())
        if args.examples != "all":
            wanted = set(args.examples.split(",")) if args.examples != "none" else set()
            examples = [p for p in examples if p.name in wanted]
        for src in examples:
            _check_source(src.name, src, compute, tmp, rows, (1, 2), verify_all=True)
        planted = _planted_change_is_found(ROOT / "examples" / "tiny-gpt-oss", compute, tmp)
        if args.big_experts:
            from synthetic import write_synthetic

            src = write_synthetic(tmp / "big-src", 1, args.big_experts)
            _check_source(f"gpt-oss layer x{args.big_experts} experts", src, compute, tmp, rows, (1,), verify_all=True)
            shutil.rmtree(src)
        if args.nvfp4_big:
            from make_tiny_nvfp4_moe import write_tiny_nvfp4_moe

            src = write_tiny_nvfp4_moe(
                tmp / "nvfp4-src",
                num_layers=1,
                num_experts=args.nvfp4_big,
                hidden_size=2048,
                moe_intermediate_size=768,
                num_shards=1,
            )
            _check_source(f"nvfp4 layer x{args.nvfp4_big} experts", src, compute, tmp, rows, (1,), verify_all=True)
    bad = [r for r in rows if r["problems"]]
    summary = {
        **info,
        "targets": len(rows),
        "tensors": sum(r["tensors"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "identical": sum(r["identical"] for r in rows),
        "verified": sum(1 for r in rows if r["verified"]),
        "failed": len(bad),
        "planted_change_found": planted,
        "backends": sorted({r["backend"] for r in rows}),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(summary), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 1 if bad or not planted else 0


if __name__ == "__main__":
    sys.exit(main())
