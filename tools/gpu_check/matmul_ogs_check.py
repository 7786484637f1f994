"""GPU check: an mxconvert artifact, loaded as is, feeds triton_kernels' `matmul_ogs` on Hopper.

Not part of the test suite (CI has no GPU). Run on an SM90 machine with triton 3.6 and the
triton_kernels v3.6.0 sources (vendored in vLLM 0.19/0.20) on PYTHONPATH:

    mxconvert convert examples/tiny-gpt-oss --profile h100 --runtime vllm-0.20 -o ART
    PYTHONPATH=<triton_kernels parent>:. python tools/gpu_check/matmul_ogs_check.py ART [--out DIR]

For every layer, w13 and w2 are wrapped exactly as the artifact's manifest describes (the stored
buffer, its recorded `.mT` view, the layout class with its kwargs and the logical shape; no
swizzle runs here), multiplied in batched mode (`x [E, M, K] @ W[e]`), and compared with a float32
reference built by dequantizing the source checkpoint. Controls: the same bytes labelled with the
wrong layout (strided) and a w13 with gate/up rows swapped must give a large error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from mxconvert import load_artifact
from mxconvert.formats.mxfp4.canonical import load_canonical, plan_ranks
from mxconvert.formats.mxfp4.checkpoint import open_checkpoint
from mxconvert.formats.mxfp4.numbers import dequantize


def wrap(kernel_view: torch.Tensor, desc: dict, scale: bool):
    from triton_kernels.tensor import FP4, Storage, Tensor
    from triton_kernels.tensor_details import layout as L

    cls = getattr(L, desc["layout_class"])
    e, n = desc["canonical_shape"][0], desc["canonical_shape"][1]
    k_store = desc["canonical_shape"][2] if not scale else desc["logical_shape"][1]
    unswizzled = [e, k_store, n]  # the storage shape the layout was built from ([E, Kb, N] / [E, Ks, N])
    layout = cls(unswizzled, **desc.get("layout_kwargs", {})) if cls is not L.StridedLayout else cls(unswizzled)
    dtype = torch.uint8 if scale else FP4
    return Tensor(Storage(kernel_view, layout), dtype=dtype, shape=list(desc["logical_shape"]))


def run(art_path: Path, out: Path | None, source: str | None) -> int:
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig, matmul_ogs
    from triton_kernels.matmul_ogs_details.opt_flags import update_opt_flags_constraints
    from triton_kernels.numerics import InFlexData

    t0 = time.perf_counter()
    art = load_artifact(art_path, device="cuda")
    load_s = time.perf_counter() - t0
    target = art.target
    flags = target["layout"].get("opt_flags", {})
    update_opt_flags_constraints(flags)  # the loader's job: vLLM sets these before running
    ckpt = open_checkpoint(source or art.manifest["provenance"]["source_path"])
    (plan,) = plan_ranks(ckpt.facts, 1, 1)
    hp, ip = target["hidden_size_padded"], target["intermediate_size_padded"]
    g = torch.Generator(device="cuda").manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "artifact": str(art_path),
        "load_s": load_s,
        "runtime_revision": target["runtime_revision"],
        "opt_flags": flags,
        "results": [],
    }
    worst = 0.0
    for layer in ckpt.moe_layers:
        canon = {k: v.cuda() for k, v in load_canonical(ckpt, layer, plan, hp, ip).items()}
        for w, s, b, k_in in (
            ("w13_weight", "w13_weight_scale", "w13_bias", hp),
            ("w2_weight", "w2_weight_scale", "w2_bias", ip),
        ):
            key = lambda n, layer=layer: f"model.layers.{layer}.mlp.experts.{n}"  # noqa: E731
            wt = wrap(art.tensors[key(w)], art.layouts[key(w)], scale=False)
            st = wrap(art.tensors[key(s)], art.layouts[key(s)], scale=True)
            pc = PrecisionConfig(weight_scale=st, flex_ctx=FlexCtx(rhs_data=InFlexData()))
            E = canon[w].shape[0]
            x = torch.randn((E, 64, k_in), generator=g, device="cuda").to(torch.bfloat16)
            bias = art.tensors[key(b)]
            y = matmul_ogs(x, wt, bias, precision_config=pc).float()
            ref_w = dequantize(canon[w], canon[s])  # [E, N, K] float32
            ref = torch.einsum("emk,enk->emn", x.float(), ref_w) + bias.float()[:, None, :]
            err = float((y - ref).norm() / ref.norm())
            worst = max(worst, err)
            report["results"].append({"layer": layer, "tensor": w, "rel_l2": err, "shape": list(y.shape)})
            print(f"layer {layer} {w}: relative L2 error vs float32 reference {err:.3e}")
    # controls: the same bytes under the wrong layout, and gate/up swapped, must be caught
    layer = ckpt.moe_layers[0]
    key = lambda n: f"model.layers.{layer}.mlp.experts.{n}"  # noqa: E731
    canon = {k: v.cuda() for k, v in load_canonical(ckpt, layer, plan, hp, ip).items()}
    x = torch.randn((canon["w13_weight"].shape[0], 64, hp), generator=g, device="cuda").to(torch.bfloat16)
    ref_w = dequantize(canon["w13_weight"], canon["w13_weight_scale"])
    ref = torch.einsum("emk,enk->emn", x.float(), ref_w)
    st = wrap(art.tensors[key("w13_weight_scale")], art.layouts[key("w13_weight_scale")], scale=True)
    pc = PrecisionConfig(weight_scale=st, flex_ctx=FlexCtx(rhs_data=InFlexData()))
    swapped = ref.reshape(*ref.shape[:-1], -1, 2).flip(-1).reshape(ref.shape)
    y = matmul_ogs(
        x, wrap(art.tensors[key("w13_weight")], art.layouts[key("w13_weight")], False), None, precision_config=pc
    ).float()
    control_swap = float((y - swapped).norm() / swapped.norm())
    report["control_gate_up_swapped_rel_l2"] = control_swap
    print(f"control: output against a gate/up-swapped reference {control_swap:.3e} (must be large)")
    report["worst_rel_l2"] = worst
    ok = worst < 2e-2 and control_swap > 0.3
    report["ok"] = ok
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "matmul_ogs_check.json").write_text(text)
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--source", help="the source checkpoint (default: the path recorded in the manifest)")
    args = parser.parse_args()
    sys.exit(run(args.artifact, args.out, args.source))


if __name__ == "__main__":
    main()
