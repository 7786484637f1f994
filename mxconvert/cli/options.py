"""The options several commands share (`select` and `convert` take the same target options), as
typer annotations: one place for each option's flag and help text."""

from __future__ import annotations

from typing import Annotated

import typer

ProfileOpt = Annotated[
    list[str],
    typer.Option(
        "--profile",
        "-p",
        help="Target device: a built-in name (see `mxconvert profiles`) or a .json/.toml profile file.",
    ),
]
RuntimeOpt = Annotated[
    str | None,
    typer.Option(
        "--runtime",
        help="auto (default: the installed vLLM's release, else vllm-0.33), a vLLM release vllm==X.Y.Z, "
        "or a revision row: vllm-0.33, vllm-0.20 (MXFP4), vllm-0.15 (NVFP4); see `mxconvert runtimes`.",
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        "-b",
        "--moe-backend",
        help="auto, a vLLM --moe-backend name (flashinfer_trtllm, triton, marlin, ...) "
        "or a backend name as printed (TRITON, FLASHINFER_TRTLLM_MXFP4_BF16, ...).",
    ),
]
#: vLLM's own spellings are accepted next to mxconvert's: `-tp` / `--tensor-parallel-size`, `-dp` /
#: `--data-parallel-size`, `-ep` / `--enable-expert-parallel` (click takes a one-dash name of several
#: letters as a whole option name, never as `-t -p`), `--moe-backend`.
TP_NAMES = ("--tp", "-tp", "--tensor-parallel-size")
TpOpt = Annotated[int, typer.Option(*TP_NAMES, help="vLLM's tensor-parallel size (the MoE runs over TP x DP ranks).")]
EpOpt = Annotated[
    int,
    typer.Option(
        "--ep", help="Expert-parallel group size: TP x DP under vLLM's expert parallelism (alone: TP = EP / DP)."
    ),
]
EnableEpOpt = Annotated[
    bool,
    typer.Option(
        "--enable-expert-parallel",
        "-ep",
        help="vLLM's expert parallelism switch: whole experts split over all TP x DP ranks.",
    ),
]
DpOpt = Annotated[
    int,
    typer.Option(
        "--dp", "-dp", "--data-parallel-size", help="vLLM's data-parallel size (dp > 1 rules out monolithic kernels)."
    ),
]
ActOpt = Annotated[
    str,
    typer.Option(
        "--activation", help="Activation dtype: bf16, or mxfp8 (quantization_config.moe.activation override)."
    ),
]
LoraOpt = Annotated[bool, typer.Option("--lora", help="LoRA enabled (only LoRA-capable kernels qualify).")]
BatchedOpt = Annotated[bool, typer.Option("--batched", help="Batched activation format (e.g. DeepEP low-latency).")]
All2allOpt = Annotated[
    str | None,
    typer.Option("--all2all", help="vLLM all2all backend (deepep_low_latency, allgather_reducescatter, ...), if any."),
]
EplbOpt = Annotated[bool, typer.Option("--eplb", help="Expert-parallel load balancing on.")]
EnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        help="Runtime env override KEY=VALUE (e.g. VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 for vllm-0.20); "
        "wins over the same VLLM_* variable of the environment, which is read too. Repeatable.",
    ),
]
MarlinOpt = Annotated[str | None, typer.Option("--marlin-input-dtype", help="VLLM_MARLIN_INPUT_DTYPE (fp8).")]
HubRevOpt = Annotated[
    str | None, typer.Option("--revision", help="Hugging Face revision (branch, tag or commit) of a hub MODEL.")
]
CacheOpt = Annotated[
    str | None, typer.Option("--cache-dir", help="Hugging Face cache folder (default: HF_HUB_CACHE / HF_HOME).")
]
LayoutOpt = Annotated[str | None, typer.Option("--layout", help="Checkpoint layout: hf or original (default: detect).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
JobsOpt = Annotated[
    int | None,
    typer.Option("--jobs", "-j", min=1, help="Worker threads (default: the cores available to this process)."),
]
FileSha256Opt = Annotated[
    bool,
    typer.Option(
        "--file-sha256",
        help="Also record each written file's whole-file sha256 in the manifest, for external tools "
        "(sha256sum -c); one sequential hash per file, slower. Every file always gets its tree digest.",
    ),
]
WriteModeOpt = Annotated[
    str,
    typer.Option(
        "--write-mode",
        help="direct: write past the page cache (O_DIRECT, where the filesystem allows; least CPU); "
        "buffered: through it (the artifact stays cached for a load right after); auto (default): "
        "direct on fewer than 8 cores, else buffered. The bytes are the same.",
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="Where the layouts run: cpu (default) or cuda / cuda:N (needs a GPU; the bytes are the same)."
    ),
]
