"""package_variant: a deliverable's wrappers and binary, copied unchanged into its variant directory of the recipe's
onnxruntime model package (plan/packages.py). Its inputs include the deliverable's verification results: the copy
is made only once they passed, so a package never holds an unverified variant."""
from __future__ import annotations

import shutil
from typing import Any


def run(ctx: Any) -> None:
    for role in ctx.action.outputs:
        shutil.copyfile(ctx.action.inputs[f"file:{role}"], ctx.tmp_output(role))
