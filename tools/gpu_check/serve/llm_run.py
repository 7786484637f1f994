#!/usr/bin/env python3
"""One vLLM engine in this process: load a model, run a fixed batch of prompts greedily, write JSON.

    python llm_run.py --model DIR --out RESULT.json [--load-format mxconvert] [--moe-backend marlin]
                      [--extra '{"on_mismatch": "reconvert"}'] [--tp 1]

Run once per side of the comparison (A: a checkpoint with vLLM's default loader; B: an mxconvert
artifact with `--load-format mxconvert`), each in a fresh process, so nothing of one load can leak
into the other. The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), which lets
this script time vLLM's own `GPUModelRunner.load_model` and read the GPU memory peak around it.

What it records (serve_check.py compares two of these files):
  * the generated token ids of every prompt (greedy, 24 new tokens, fixed prompt token ids: the
    tokenizer is never used, `skip_tokenizer_init=True`);
  * the log-probabilities vLLM returns: the top-8 of every prompt position (`prompt_logprobs`) and
    of every generated position (`logprobs`), as float hex strings so "equal" means bit-equal;
  * load figures: `GPUModelRunner.load_model` wall time and the CUDA allocator's peak above what was
    allocated before it (torch.cuda.max_memory_allocated), the memory it leaves allocated, vLLM's own
    log lines ("Loading weights took", "Model loading took"), and the wall time from `LLM(...)` to a
    ready engine;
  * on failure: the exception type and message (the fail-closed cases expect one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPT_LENGTHS = (7, 19, 33, 64, 5, 48, 12, 27)
NEW_TOKENS = 24
TOP_LOGPROBS = 8


def prompts(vocab: int, seed: int = 1234) -> list[list[int]]:
    """Fixed prompt token ids (a linear congruential stream: no numpy or torch RNG version in play)."""
    state, out = seed, []
    for n in PROMPT_LENGTHS:
        ids = []
        for _ in range(n):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            ids.append(int(state >> 33) % vocab)
        out.append(ids)
    return out


class LoadProbe:
    """Wraps vLLM's GPUModelRunner.load_model (both model-runner generations) to time it and read the
    allocator's peak around it."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def install(self) -> None:
        import importlib

        for module_name in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"):
            try:
                module = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001 - a generation this release lacks
                continue
            runner = getattr(module, "GPUModelRunner", None)
            if runner is None or getattr(runner.load_model, "_probed", False):
                continue
            runner.load_model = self._wrap(runner.load_model)

    def _wrap(self, original):
        import torch

        probe = self

        def load_model(runner, *args, **kwargs):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            try:
                return original(runner, *args, **kwargs)
            finally:
                torch.cuda.synchronize()
                probe.records.append(
                    {
                        "runner": type(runner).__module__,
                        "seconds": time.perf_counter() - t0,
                        "peak_bytes_above_start": torch.cuda.max_memory_allocated() - before,
                        "resident_bytes": torch.cuda.memory_allocated() - before,
                    }
                )

        load_model._probed = True  # type: ignore[attr-defined]
        return load_model


class LogLines:
    """Keeps vLLM's own load-time log lines."""

    KEYS = ("Loading weights took", "Model loading took", "init engine", "mxconvert", "MoE backend", "Using ")

    def __init__(self) -> None:
        import logging

        self.lines: list[str] = []
        outer = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    message = record.getMessage()
                except Exception:  # noqa: BLE001
                    return
                if any(k in message for k in outer.KEYS):
                    outer.lines.append(f"{record.name}: {message}")

        self.handler = Keep()

    def install(self) -> None:
        import logging

        for name in ("vllm", "mxconvert"):
            logging.getLogger(name).addHandler(self.handler)


def hexes(logprob_dict) -> list[list]:
    """A position's logprob dict as sorted [token, logprob as float hex, rank] rows."""
    if logprob_dict is None:
        return []
    rows = [[int(tok), float(lp.logprob).hex(), lp.rank] for tok, lp in logprob_dict.items()]
    return sorted(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--moe-backend", default="auto")
    ap.add_argument("--extra", default=None, help="model_loader_extra_config as JSON")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", action="store_true", help="enable_expert_parallel (vLLM's EP size = TP)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--no-generate", action="store_true", help="load only (timing runs)")
    a = ap.parse_args()

    result: dict = {"argv": sys.argv[1:], "ok": False}
    t_start = time.perf_counter()
    logs = LogLines()
    probe = LoadProbe()
    try:
        import torch
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm"] = vllm.__version__
        result["torch"] = torch.__version__
        result["device"] = torch.cuda.get_device_name(0)
        result["import_seconds"] = time.perf_counter() - t_start
        logs.install()
        logging.getLogger("mxconvert").setLevel(logging.INFO)  # the plugin's checksum / read-ahead lines
        probe.install()
        kwargs = dict(
            model=a.model,
            load_format=a.load_format,
            enforce_eager=True,
            skip_tokenizer_init=True,
            max_model_len=1024,
            max_num_seqs=len(PROMPT_LENGTHS),
            gpu_memory_utilization=a.gpu_memory_utilization,
            tensor_parallel_size=a.tp,
            seed=0,
            attention_backend="TRITON_ATTN",
            # vLLM 0.26.0 asks FlashInfer whether its sampler can run unless the logprobs it must
            # return are post-processing ones; FlashInfer is not installed here (the check needs none
            # of its kernels), so ask for processed logprobs (greedy: the same values, same for A and B).
            logprobs_mode="processed_logprobs",
        )
        if a.moe_backend != "auto":
            kwargs["moe_backend"] = a.moe_backend
        if a.ep:
            kwargs["enable_expert_parallel"] = True
        if a.tp > 1:
            # No custom or symmetric-memory all-reduce: NCCL only, with NVLink multicast off as the
            # machine sets it (NCCL_NVLS_ENABLE=0); the same for A and B.
            kwargs["disable_custom_all_reduce"] = True
            os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
        if a.extra:
            kwargs["model_loader_extra_config"] = json.loads(a.extra)
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        result["engine_ready_seconds"] = time.perf_counter() - t0
        result["load"] = probe.records
        if not a.no_generate:
            vocab = llm.llm_engine.model_config.get_vocab_size()
            ids = prompts(vocab)
            params = SamplingParams(
                temperature=0.0,
                max_tokens=NEW_TOKENS,
                ignore_eos=True,
                detokenize=False,
                logprobs=TOP_LOGPROBS,
                prompt_logprobs=TOP_LOGPROBS,
            )
            outs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
            result["outputs"] = [
                {
                    "prompt": o.prompt_token_ids,
                    "tokens": list(o.outputs[0].token_ids),
                    "logprobs": [hexes(d) for d in (o.outputs[0].logprobs or [])],
                    "prompt_logprobs": [hexes(d) for d in (o.prompt_logprobs or [])],
                }
                for o in outs
            ]
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - the fail-closed cases expect a refusal
        result["error_type"] = type(exc).__name__
        result["error"] = str(exc)[-4000:]
        result["traceback"] = traceback.format_exc()[-6000:]
    result["log_lines"] = logs.lines
    result["load"] = probe.records
    result["wall_seconds"] = time.perf_counter() - t_start
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result.get(k) for k in ("ok", "error_type", "engine_ready_seconds", "load")}, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
