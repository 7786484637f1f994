"""mxconvert: offline pre-layout of FP4 MoE expert weights for the kernel a runtime will run.

The library is what the command line runs (`mxconvert select`, `convert`, `verify`, `inspect`),
without argument parsing and rendering. Everything a Python user needs is a name of this module;
every other module of the package is internal and may change.

    plan(model, profile=...)            what `convert` would write, every check run, nothing written
    convert(model, out, profile=...)    write the artifact(s); an up-to-date one is left as it is
    verify(artifact, source=None)       prove an artifact is the image of its source
    describe(path) / diff(a, b)         an artifact's or a checkpoint's layout, and a comparison of two
    load_artifact(path, rank=0)         one rank's kernel tensors, checksums verified
    get_profile(name) / get_revision(name)   the targets: a device, a runtime release
    MxconvertError > InputError, UnsupportedError, MismatchError   every error raised on purpose

Example:

```python
import mxconvert

result = mxconvert.convert("openai/gpt-oss-20b", "gpt-oss-20b-h100", profile="h100", tp=2)
print(result.targets[0].status)                        # "written", or "up_to_date" on a re-run
report = mxconvert.verify("gpt-oss-20b-h100")
assert report.ok, [p.message for p in report.problems]
art = mxconvert.load_artifact("gpt-oss-20b-h100", rank=1, expect={"backend": "TRITON"})
w13 = art.tensors["model.layers.0.mlp.experts.w13_weight"]
```

Each function's docstring has Args / Returns / Raises / Example sections. The names are imported
on first use (PEP 562 `__getattr__`), so `import mxconvert` costs nothing: the command line imports
this package before it installs its signal handlers (mxconvert/_entry.py), and `mxconvert --help`,
`profiles` and `select` start without torch or numpy (tests/test_startup.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from mxconvert.core.version import __version__

if TYPE_CHECKING:  # for type checkers and editors only; at run time `__getattr__` imports on use
    from mxconvert.artifact.loader import LoadedArtifact, load_artifact
    from mxconvert.core.errors import InputError, MismatchError, MxconvertError, UnsupportedError
    from mxconvert.pipeline.inspect import describe, diff
    from mxconvert.pipeline.targets import convert, plan
    from mxconvert.pipeline.verify import verify
    from mxconvert.target.profiles import DeviceProfile, get_profile
    from mxconvert.target.revisions import RuntimeRevision, get_revision

#: Public name -> the module that defines it. The only names the package exports; anything else is
#: internal to its folder (docs/architecture.md, "The tree").
_EXPORTS: dict[str, str] = {
    "plan": "mxconvert.pipeline.targets",
    "convert": "mxconvert.pipeline.targets",
    "verify": "mxconvert.pipeline.verify",
    "describe": "mxconvert.pipeline.inspect",
    "diff": "mxconvert.pipeline.inspect",
    "load_artifact": "mxconvert.artifact.loader",
    "LoadedArtifact": "mxconvert.artifact.loader",
    "DeviceProfile": "mxconvert.target.profiles",
    "get_profile": "mxconvert.target.profiles",
    "RuntimeRevision": "mxconvert.target.revisions",
    "get_revision": "mxconvert.target.revisions",
    "MxconvertError": "mxconvert.core.errors",
    "InputError": "mxconvert.core.errors",
    "UnsupportedError": "mxconvert.core.errors",
    "MismatchError": "mxconvert.core.errors",
}

__all__ = [
    "plan",
    "convert",
    "verify",
    "describe",
    "diff",
    "load_artifact",
    "LoadedArtifact",
    "DeviceProfile",
    "get_profile",
    "RuntimeRevision",
    "get_revision",
    "MxconvertError",
    "InputError",
    "UnsupportedError",
    "MismatchError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use and keep it here, so that the next use is
    a plain attribute lookup. Any other name is an AttributeError, internal modules included."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mxconvert' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names only (`dir(mxconvert)`, completion in a REPL)."""
    return sorted(__all__)
