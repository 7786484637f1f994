"""One-off: run `select` (text and --json) and `convert --dry-run` (text and --json) in-process for
every example x built-in profile x TP 1/2, in the checkout given as argv[1] (its package is the one
imported), on the example folders under argv[3] (the same folders for both versions: paths are
printed), and write stdout/stderr/exit code of each run as JSON to argv[2].

    python bench/results/session5/select_compare.py /tmp/main-checkout before.json $PWD/examples
    python bench/results/session5/select_compare.py $PWD after.json $PWD/examples
    python bench/results/session5/select_compare_diff.py before.json after.json
"""

import contextlib
import io
import json
import sys
from pathlib import Path

root = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(root))
from mxconvert.cli.main import app  # noqa: E402
from mxconvert.target.profiles import BUILTIN_PROFILES  # noqa: E402

examples = sorted(p for p in Path(sys.argv[3]).iterdir() if p.is_dir())  # the same folders for both versions
runs = []
for ex in examples:
    for prof in BUILTIN_PROFILES:
        for tp in (1, 2):
            for extra in ([], ["--json"]):
                for cmd in (["select"], ["convert", "--dry-run", "-o", "/tmp/notorch/never-written"]):
                    args = [*cmd, str(ex), "-p", prof.name, "--tp", str(tp), *extra]
                    out, err = io.StringIO(), io.StringIO()
                    code = 0
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                        try:
                            app(args, standalone_mode=True)
                        except SystemExit as exc:
                            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    runs.append({"args": args, "code": code, "out": out.getvalue(), "err": err.getvalue()})
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "pydantic"))
Path(sys.argv[2]).write_text(
    json.dumps({"runs": runs, "heavy_modules_loaded": len(loaded), "torch_loaded": "torch" in sys.modules})
)
