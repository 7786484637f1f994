"""What `verify` reports: each problem it finds (kind, message, and where: file, tensor, rank,
expert, first differing index) and the counts and largest dequantized differences of a run.
`VerifyReport.to_json` is what `mxconvert verify --json` prints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Problem:
    kind: str  # manifest | file | source | layout | tensor | padding | passthrough
    message: str
    file: str | None = None
    tensor: str | None = None
    rank: int | None = None
    expert: int | None = None
    index: list[int] | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class VerifyReport:
    artifact: str
    source: str | None = None
    fingerprint: str | None = None
    files_checked: int = 0
    tensors_checked: int = 0
    passthrough_checked: int = 0
    max_dequant_diff: dict[str, float] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "artifact": self.artifact,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "files_checked": self.files_checked,
            "tensors_checked": self.tensors_checked,
            "passthrough_checked": self.passthrough_checked,
            "max_dequant_diff": self.max_dequant_diff,
            "problems": [p.to_json() for p in self.problems],
        }
