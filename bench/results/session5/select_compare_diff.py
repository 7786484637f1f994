"""One-off: compare two outputs of select_compare.py (before, after): every run's stdout, stderr and
exit code must be identical; prints the counts per command and the first differences."""

import collections
import json
import sys
from pathlib import Path

before = json.loads(Path(sys.argv[1]).read_text())
after = json.loads(Path(sys.argv[2]).read_text())
assert len(before["runs"]) == len(after["runs"])
counts: collections.Counter = collections.Counter()
diffs = 0
for x, y in zip(before["runs"], after["runs"]):
    assert x["args"] == y["args"]
    kind = x["args"][0] + (" --json" if "--json" in x["args"] else "")
    counts[kind, "runs"] += 1
    counts[kind, "refused" if x["code"] else "ok"] += 1
    if x != y:
        diffs += 1
        if diffs <= 5:
            print("DIFF", x["args"])
            print(" before:", x["code"], x["out"][-600:], x["err"][-600:])
            print(" after: ", y["code"], y["out"][-600:], y["err"][-600:])
for key in sorted(counts):
    print(key, counts[key])
print("runs", len(before["runs"]), "differing", diffs)
print("torch loaded: before", before["torch_loaded"], "after", after["torch_loaded"])
