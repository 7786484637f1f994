"""Layouts unchanged by the tree digest (issue 24): every example converted for several targets by
an older checkout and by this one; every written file must be byte-identical, the tree digests
equal, and the manifests equal once the digest fields, the schema and the fingerprint (which
seals them) are set aside. A target the older code refuses must be refused alike.

    git worktree add /tmp/digest-before 675175d
    python bench/layouts_unchanged.py /tmp/digest-before [--out DIR]

Prints one line per target and `ALL IDENTICAL` (exit 0) or `SOME DIFFER` (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

AFTER = Path(__file__).resolve().parents[1]
GPT_OSS = "tiny-gpt-oss"
NVFP4 = ("tiny-nvfp4-ct-deepseek", "tiny-nvfp4-ct-qwen3", "tiny-nvfp4-modelopt-deepseek", "tiny-nvfp4-modelopt-qwen3")
#: (example, convert arguments)
CASES = (
    [(GPT_OSS, ["-p", p, "--tp", tp]) for p in ("h100", "b200", "mi355x") for tp in ("1", "2")]
    + [(GPT_OSS, ["-p", "h100", "--max-shard-size", "400000"])]  # several files per rank, split tensors
    + [(GPT_OSS, ["-p", "b200", "--ep", "2"])]
    + [(e, ["-p", p]) for e in NVFP4 for p in ("h100", "b200")]
)
DIGESTS = ("sha256", "sha256_chunked")


def _convert(root: Path, example: str, args: list[str], out: Path) -> dict | str:
    """The manifest, or the last line of the refusal."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "mxconvert", "convert", str(AFTER / "examples" / example), "-o", str(out), *args]
    env = dict(os.environ, PYTHONPATH=str(root), MXCONVERT_FAULT="")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
    if done.returncode:
        return f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:120]}"
    return json.loads((out / "mxconvert.json").read_text())


def _without_digests(manifest: dict) -> dict:
    m = json.loads(json.dumps(manifest))
    for key in ("schema", "fingerprint", "provenance"):
        m.pop(key, None)
    for entry in [f for r in m["ranks"] for f in r["files"]] + m["shared"]["files"]:
        for key in DIGESTS:
            entry.pop(key, None)
    return m


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def compare(before: Path, out: Path) -> bool:
    ok = True
    for i, (example, args) in enumerate(CASES):
        a_out, b_out = out / f"{i}-before", out / f"{i}-after"
        a, b = _convert(before, example, args, a_out), _convert(AFTER, example, args, b_out)
        label = f"{example} {' '.join(args)}"
        if isinstance(a, str) or isinstance(b, str):
            same = a == b
            ok &= same
            print(f"{label}: {'both refused alike' if same else 'DIFFER'} ({a} | {b})")
            continue
        fa, fb = _files(a_out), _files(b_out)
        differ = [f for f in fa if f != "mxconvert.json" and fa.get(f) != fb.get(f)] + sorted(set(fb) - set(fa))
        written_a = [f for r in a["ranks"] for f in r["files"]] + a["shared"]["files"]
        written_b = [f for r in b["ranks"] for f in r["files"]] + b["shared"]["files"]
        trees = all(x.get("sha256_chunked") == y.get("sha256_chunked") for x, y in zip(written_a, written_b))
        same = not differ and trees and _without_digests(a) == _without_digests(b)
        ok &= same
        nbytes = sum(len(v) for k, v in fb.items() if k != "mxconvert.json")
        print(
            f"{label}: {'IDENTICAL' if same else 'DIFFER ' + str(differ)} ({len(fb) - 1} files, {nbytes} bytes; "
            f"schema {a['schema']} -> {b['schema']}; tree digests equal: {trees})"
        )
        shutil.rmtree(a_out)
        shutil.rmtree(b_out)
    print("ALL IDENTICAL" if ok else "SOME DIFFER")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="a checkout of the older mxconvert (its package folder's parent)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/layouts-unchanged"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(0 if compare(args.before.resolve(), args.out) else 1)


if __name__ == "__main__":
    main()
