"""One-off: run a script (argv[1], with the remaining arguments) with every import of torch or numpy
refused (an ImportError with the importing stack printed), as the after side of select_compare.py
was run: a planning path that reached torch would fail there instead of passing quietly.

    python bench/results/session5/refuse_torch.py bench/results/session5/select_compare.py $PWD after.json $PWD/examples
"""

import sys
import traceback


class RefuseHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            traceback.print_stack(limit=12)
            raise ImportError(f"refused import of {name}")
        return None


sys.meta_path.insert(0, RefuseHeavy())
sys.argv = sys.argv[1:]
with open(sys.argv[0]) as f:
    code = compile(f.read(), sys.argv[0], "exec")
exec(code, {"__name__": "__main__"})
