"""A signal that arrives while a module is being imported is raised right after the import, never
inside it: an exception thrown into an import leaves half-initialised modules behind (numpy then
refuses to load again) or is rewrapped (`__set_name__` turns it into RuntimeError), which once made
a SIGTERM during `import torch` end as "internal error" instead of exit 143."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_signal_during_import_is_raised_after_the_import_finishes(tmp_path):
    (tmp_path / "slow_module.py").write_text(
        textwrap.dedent("""
        import sys, time
        class Named:
            def __set_name__(self, owner, name):
                print("import started", flush=True)
                time.sleep(1.5)  # the signal arrives here, inside the class body's __set_name__
        class Owner:
            field = Named()
        print("import finished", flush=True)
    """)
    )
    script = textwrap.dedent("""
        import sys
        from mxconvert.core.errors import Interrupted, install_signal_handlers
        install_signal_handlers()
        try:
            import slow_module
            import time
            time.sleep(5)
            print("not interrupted")
        except Interrupted as exc:
            print(f"interrupted by {exc.signum}")
            sys.exit(exc.exit_code)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "import started"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rest, stderr = proc.communicate(timeout=30)
    assert stderr == ""
    assert rest.split("\n")[:2] == ["import finished", f"interrupted by {int(signal.SIGTERM)}"]
    assert proc.returncode == 128 + signal.SIGTERM
