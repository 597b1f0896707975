"""Issue 48: progress, the summary's counts and the report show only actions that ran or were restored. A
`precision: auto` candidate an earlier one made unneeded writes placeholders only (its gate is closed): it was
printed (`compile tiny_cnn@SM8650 (candidate fp16)` after the first candidate passed) and counted ("33 built, 12
restored" on an empty cache, the 12 placeholders). A full file: a search over three targets' worth of actions."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import keep_only, records

STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")


def test_search_progress_and_counts_show_only_work_that_ran(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """precision: auto where the first candidate passes: the later candidates' actions only write placeholders.
    Before, progress printed `compile tiny_cnn@SM8650 (candidate fp16)` and the summary counted them."""
    keep_only(tree, "tiny_cnn.yaml")
    recipe = tree / "tiny_cnn.yaml"
    recipe.write_text(recipe.read_text().replace("precision: w8a16", "precision: auto"))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--target", "SM8650", "--explain")
    assert r.code == 0, r.text
    progress = [m for line in r.out.splitlines() if (m := STATUS.match(line))]
    worked = {i: rec for i, rec in records(out).items() if not rec.get("not_needed")}
    assert len(worked) < len(records(out))  # the search did skip candidates
    assert {m[3] for m in progress if not m[3].startswith("search ")} == \
        {rec_desc for rec_desc in _descriptions(out, worked) if not rec_desc.startswith("search ")}
    assert not any("(candidate fp16)" in m[3] or "fp16@" in m[3] for m in progress), r.out
    assert [int(m[1]) for m in progress] == list(range(1, len(progress) + 1))
    assert progress[-1][1] == progress[-1][2]  # the last line's count is the whole: nothing left out is counted
    assert any(re.search(r"search tiny_cnn: need \S+\? no: w8a16 passed$", m[3]) for m in progress), r.out
    head = next(line for line in r.out.splitlines() if " built, " in line)
    assert head.startswith(f"ctxbuild: {len(worked)} built, 0 restored, 0 failed"), head
    skipped = sorted(set(records(out)) - set(worked))
    assert f"explain: {skipped[0]}: not needed by the precision search (an earlier candidate decided it): " \
           "placeholders only" in r.out, r.out
    report = json.loads((out / "report.json").read_text())
    assert report["build"]["built"] == len(worked) and report["build"]["actions"] == len(worked)
    assert {n["id"] for n in report["graph"]["nodes"]} == set(worked)


def _descriptions(out: Path, ids: dict[str, object]) -> set[str]:
    plan = json.loads((out / ".ctxbuild" / "plan.json").read_text())
    return {a["description"] for a in plan["actions"] if a["id"] in ids}
