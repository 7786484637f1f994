"""What planning and converting targets give (pipeline/targets.py): a target's decisions before
writing (`Planned`), what a `convert` call did with each, and the `convert --json` documents."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mxconvert.pipeline.plan import serve_command

if TYPE_CHECKING:
    from mxconvert.pipeline.plan import Plan


@dataclass
class Planned:
    """Everything `select`, `convert --dry-run` and `convert` decide before writing, for one target."""

    ckpt: Any
    plan: Plan
    warnings: list[str]
    environment: dict[str, dict]

    @property
    def folder_name(self) -> str:
        """Sub-folder of a multi-target OUT: `<profile>-tp<N>` (`-ep<N>` under expert parallelism).
        Not yet checked: `target_folders` refuses a name that is not a safe folder name."""
        dep = self.plan.deployment
        return f"{self.plan.profile.name}-tp{dep.tp}" + (f"-ep{dep.ep}" if dep.ep > 1 else "")


#: Version of the JSON that `convert --json` prints (dry run and real run alike); see README.
CONVERT_JSON_SCHEMA = "mxconvert.convert/1"
#: Version of the JSON `convert --json` prints for several targets: one convert document each.
MULTI_JSON_SCHEMA = "mxconvert.convert-multi/1"


@dataclass
class TargetResult:
    """One target of a `convert` call: what happened (`status`: "planned", "written" or
    "up_to_date"), where, and the artifact's sealed manifest (None when only planned)."""

    status: str
    artifact: Path
    planned: Planned
    manifest: dict | None
    summary: dict = field(repr=False)

    def to_json(self) -> dict:
        """The `convert --json` document (schema `mxconvert.convert/1`)."""
        if self.manifest is not None:
            m = self.manifest
            files = [f for r in m["ranks"] for f in r["files"]] + m["shared"]["files"] + m.get("aux_files", [])
            count, size, fp = len(files), sum(f["size"] for f in files), m["fingerprint"]
        else:
            planned_files = [f for r in self.summary["ranks"] for f in r["files"]] + self.summary["shared_files"]
            count, size, fp = len(planned_files), self.summary["total_bytes"], None
        return {
            "schema": CONVERT_JSON_SCHEMA,
            "status": self.status,
            "dry_run": self.status == "planned",
            "artifact": str(self.artifact),
            "fingerprint": fp,
            "files": count,
            "bytes": size,
            "environment": self.planned.environment,
            "warnings": self.planned.warnings,
            "serve_command": serve_command(self.summary["target"], str(self.artifact)),
            **self.summary,
        }


@dataclass
class ConvertResult:
    """What a `convert` call did: one `TargetResult` per target, in order."""

    out: Path
    targets: list[TargetResult]

    @property
    def multi(self) -> bool:
        return len(self.targets) > 1

    def to_json(self) -> dict:
        """`convert --json`: one target's document, or `mxconvert.convert-multi/1` for several."""
        if self.multi:
            return {
                "schema": MULTI_JSON_SCHEMA,
                "artifact_root": str(self.out),
                "targets": [t.to_json() for t in self.targets],
            }
        return self.targets[0].to_json()
