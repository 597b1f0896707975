"""The Action: one unit of work with declared inputs, outputs and parameters; its spec file is what ninja runs."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxbuild import layout


@dataclass
class Action:
    id: str  # stable and readable: "compile/mobilenet@SM8650"
    kind: str  # prepare | quantize | compile | bundle | verify
    description: str
    inputs: dict[str, str]  # role -> absolute path of a file another action or the user provides
    outputs: dict[str, str]  # role -> absolute path
    params: dict[str, Any]  # everything else that decides the outputs (canonical JSON)
    recipes: list[str] = field(default_factory=list)  # recipe names, for errors and the report
    recipe_files: list[str] = field(default_factory=list)
    target: dict[str, Any] | None = None
    watch: list[str] = field(default_factory=list)  # directories ninja should watch (calibration dirs)
    pool: str | None = None
    toolchain: str | None = None  # a provisioned toolchain's name (toolchain/choose.py); None: the installed one
    # Input roles (a trailing ':' makes a prefix) -> the directories they must resolve into each time they are read
    # (userfiles.checked): what the recipe checks confined at plan time. Not in the key: it holds absolute paths.
    confine: dict[str, list[str]] = field(default_factory=dict)

    @property
    def spec_name(self) -> str:
        return layout.spec_name(self.id)

    def delivered(self, out: Path) -> bool:
        """Deliverables live under OUT/<target>/ (and OUT/packages/); verification twins live in the work dir."""
        return not Path(next(iter(self.outputs.values()))).is_relative_to(out / layout.STATE)

    def identity(self) -> Any:
        """What makes two actions the same work (for dedupe across recipes)."""
        return [self.kind, self.params, sorted(self.inputs.items()), sorted(self.outputs.items()), self.toolchain]

    def to_spec(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_spec(cls, data: dict[str, Any]) -> "Action":
        return cls(**data)


def load_spec(path: Path) -> Action:
    return Action.from_spec(json.loads(path.read_text()))
