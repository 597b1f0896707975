"""Render OUT/build.ninja from the plan (one template, one place) and run the ninja binary from PyPI."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxbuild import __version__
from ctxbuild.plan import kinds
from ctxbuild.graph import LEGALIZE_DIR
from ctxbuild.atomic import read_json, write_if_changed
from ctxbuild.layout import STATE, depfile_path, log_path, rel
from ctxbuild.engine.fast.links import linked_inputs
from ctxbuild.engine.console import Console
from ctxbuild.engine.ninjaquote import ninja_command, ninja_path, ninja_value
from ctxbuild.procs import check_interrupt, die_with_parent, run_interruptible
from ctxbuild.templating import environment, template_file

if TYPE_CHECKING:
    from ctxbuild.plan.planner import Plan


def ninja_binary() -> str:
    """The `ninja` package's binary next to this interpreter: never one found on PATH by accident."""
    import ninja

    return str(Path(ninja.BIN_DIR) / "ninja")


@dataclass
class Edge:
    outputs: list[str]
    inputs: list[str]
    spec: str
    desc: str
    rule: str
    depfile: str | None
    pool: str | None


def _rel(p: str, out: Path) -> str:
    return ninja_path(rel(p, out))


def render(plan: Plan, *, compile_jobs: int, invocation: dict[str, Any]) -> None:
    """Write build.ninja, the action specs and plan state, each only if changed (ninja sees no new mtime)."""
    from ctxbuild.digests import canonical_json
    from ctxbuild.plan import adapters as plan_adapters

    out = plan.out
    state = out / STATE
    specs = state / "actions"
    edges: list[Edge] = []
    by_recipe: dict[str, list[str]] = {}
    by_target: dict[str, list[str]] = {}
    by_pair: dict[str, list[str]] = {}
    wanted_specs = set()
    for a in plan.actions:
        spec_path = specs / a.spec_name
        wanted_specs.add(spec_path.name)
        write_if_changed(spec_path, canonical_json(a.to_spec()), durable=False)
        outs = [_rel(p, out) for p in a.outputs.values()]
        ins = [_rel(p, out) for p in a.inputs.values()] + [_rel(str(w), out) for w in a.watch]
        ins.append(_rel(str(spec_path), out))
        needs_depfile = kinds.get(a.kind).discovers_inputs  # external data / samples found at run time
        # The spec stays last: prerestore finds the action by it in ninja's evaluated commands.
        args = [f"--toolchain={a.toolchain}"] if a.toolchain else []
        edges.append(Edge(outs, ins, ninja_command([*args, rel(str(spec_path), out)]), ninja_value(a.description),
                          "action_dep" if needs_depfile else "action",
                          ninja_value(rel(str(depfile_path(out, a.id)), out)) if needs_depfile else None, a.pool))
        for r in a.recipes:
            by_recipe.setdefault(f"recipe/{r}", []).extend(outs)
            if a.target:
                by_pair.setdefault(f"{r}@{a.target['name']}", []).extend(outs)
        if a.target:
            by_target.setdefault(f"target/{a.target['name']}", []).extend(outs)
    # A pair target must include its upstream (prepare/quantize) outputs too: ninja builds them as inputs anyway.
    phonies = sorted((k, sorted(set(v))) for d in (by_recipe, by_target, by_pair) for k, v in d.items())
    all_outs = sorted({o for e in edges for o in e.outputs})
    phonies.append(("all", all_outs))
    # `ctxbuild verify`: the verification edges (verify, verify_adapter, a precision search's select)
    verify_outs = sorted({o for a, e in zip(plan.actions, edges) if kinds.get(a.kind).verification for o in e.outputs})
    phonies.append(("verify", verify_outs))

    for stale in specs.glob("*.json"):
        if stale.name not in wanted_specs:
            stale.unlink()

    generator_deps = generator_inputs(plan)
    text = environment(keep_trailing_newline=True).get_template("build.ninja.j2").render(
        version=__version__, recipe_roots=ninja_value(", ".join(invocation["paths"])), compile_jobs=compile_jobs,
        # a plain script without site (-S): the edge client's start-up is paid once per action
        client=ninja_command([sys.executable, "-S", str(Path(__file__).parent / "run" / "client.py")]),
        regen=ninja_command([sys.executable, "-m", "ctxbuild", "regenerate", "."]),  # ninja runs in OUT
        generator_deps=[_rel(p, out) for p in generator_deps], edges=edges, phonies=phonies)

    write_if_changed(state / "invocation.json", canonical_json(invocation), durable=False)
    write_if_changed(state / "plan.json", canonical_json({
        "artifacts": plan.artifacts(),
        "adapters": plan_adapters.adapter_rows(plan.actions, plan.graph.successors),
        "actions": action_rows(plan),
        "generator_deps": generator_deps,  # the driver's staleness check stats exactly the generator edge's inputs
        "toolchain_deps": [str(p) for p in _toolchain_files()],  # the plan cache stats these, hashes the rest
        "links": linked_inputs(plan.actions, out),  # outside inputs through a symlink: the driver stamps them
        "cache": plan.recipes.cache,
    }), durable=False)
    if not write_if_changed(out / "build.ninja", text.encode(), durable=False):
        os.utime(out / "build.ninja")  # the generator edge's output must end newer than its inputs, or it loops
    clean_dead(out, {a.id for a in plan.actions})


def action_rows(plan: Plan) -> list[dict[str, Any]]:
    """plan.json's actions, upstream first: what the driver, the report and a dry run read without the planner."""
    from ctxbuild.plan.search import candidate_actions

    actions = plan.actions  # a topological sort per call
    by_id = {a.id: a for a in actions}
    producer = {p: a.id for a in actions for p in a.outputs.values()}
    return [{"id": a.id, "kind": a.kind, "recipes": a.recipes, "target": a.target, "toolchain": a.toolchain,
             "description": a.description, "outputs": list(a.outputs.values()),
             "deps": sorted(plan.graph.predecessors(a.id)),
             **({"candidates": candidate_actions(a, by_id, producer)} if kinds.get(a.kind).picks_candidate else {})}
            for a in actions]


def clean_dead(out: Path, planned: set[str]) -> None:
    """Outputs of actions no longer planned (a deleted recipe, target or graph) are stale artifacts: remove
    them with `ninja -t cleandead` (meson does the same after regenerating), and their records and logs,
    so neither the manifest nor the report can list them."""
    state = out / STATE
    if (state / ".ninja_log").is_file():
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}  # a tool, no job slots
        subprocess.run([ninja_binary(), "-t", "cleandead"], cwd=out, stdout=subprocess.DEVNULL, check=False, env=env)
    dirs: set[Path] = set()
    for record in (state / "records").glob("*.json"):
        try:
            old = json.loads(record.read_text())
            action_id = old["id"]
        except (OSError, ValueError, KeyError):
            continue
        if action_id in planned:
            continue
        for o in (old.get("outputs") or {}).values():  # cleandead misses outputs ninja never built (restored by a driver)
            (out / o["path"]).unlink(missing_ok=True)
            dirs.add((out / o["path"]).parent)
        for p in (log_path(out, action_id), depfile_path(out, action_id), record):
            p.unlink(missing_ok=True)
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        while d != out and d.is_relative_to(out) and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent


def generator_inputs(plan: Plan) -> list[str]:
    """What build.ninja is made from: recipes, defaults, recipe directories (a new file changes their
    mtime), the planner and the QNN libraries. One list for the generator edge and the driver.
    Grouped, each group sorted: the order must not depend on where the checkout or the recipes live."""
    groups = [[*plan.recipes.files, *plan.recipes.dirs], _planner_files(), _toolchain_files()]
    return list(dict.fromkeys(str(p) for group in groups for p in sorted(group)))


def _planner_files() -> list[Path]:
    """The planner's own code (plan/, recipes/, the SoC table targets resolve against, this module, the template)
    and the legalization rules, whose digest is in prepare's spec: a new ctxbuild re-plans (meson does the same
    on a version change)."""
    pkg = Path(__file__).resolve().parents[1]
    return [*sorted((pkg / "plan").glob("*.py")), *sorted((pkg / "recipes").glob("*.py")),
            *sorted(LEGALIZE_DIR.glob("*.py")),
            pkg / "recipes" / "recipe.schema.json", pkg / "qnn" / "socs.py", Path(__file__).resolve(),
            template_file("build.ninja.j2")]


def _toolchain_files() -> list[Path]:
    from ctxbuild.toolchain.installed import library_files

    return library_files()


def run(out: Path, targets: list[str], *, jobs: int | None, keep_going: int, dry_run: bool,
        env: dict[str, str] | None = None, console: Console | None = None) -> int:
    console = console or Console()
    cmd = [ninja_binary(), *console.ninja_args()]
    if jobs is not None:
        cmd += ["-j", str(jobs)]
    cmd += ["-k", str(keep_going)]
    if dry_run:
        cmd.append("-n")
    cmd += targets
    full_env = {**os.environ, **(env or {}), **console.ninja_env()}
    full_env.setdefault("NINJA_STATUS", "[%f/%t] ")
    fds = jobserver_fds(full_env)
    # cwd, not -C: no "Entering directory" noise. ninja dies with the driver (it kills its running edges).
    # Its stdout comes through the console filter (each failure once, no internal command lines).
    readers: list[threading.Thread] = []

    def started(p: subprocess.Popen[bytes]) -> None:
        for pipe, stream in ((p.stdout, None), (p.stderr, sys.stderr)):
            assert pipe is not None  # a copy of the pipe: Popen closes its own on the way out, maybe mid-read
            readers.append(threading.Thread(target=console.ninja_output, daemon=True,
                                            args=(os.fdopen(os.dup(pipe.fileno()), "rb"), stream)))
            readers[-1].start()

    try:
        return run_interruptible(cmd, env=full_env, cwd=out, preexec_fn=die_with_parent, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, on_start=started, pass_fds=fds)
    finally:
        for r in readers:
            r.join()


_JOBSERVER_AUTH = re.compile(r" ?--jobserver-(?:auth|fds)=(\S+)")


def jobserver_fds(env: dict[str, str]) -> tuple[int, ...]:
    """make's jobserver, for ninja (>= 1.13.2 reads both of make's protocols itself; measured: under
    `make -j2` it ran 2 actions at once, alone 3). The fifo protocol (make >= 4.4) names a path; make 4.3's
    names two inherited fds, which subprocess would close: they are passed on. If make did not pass them
    (a recipe line not marked `+`), the auth is dropped from MAKEFLAGS, or ninja stops with "could not
    initialize jobserver"; ninja then runs as it would alone."""
    flags = env.get("MAKEFLAGS", "")
    m = _JOBSERVER_AUTH.search(flags)
    if m is None or m.group(1).startswith("fifo:"):
        return ()
    try:
        fds = tuple(int(x) for x in m.group(1).split(","))
        for fd in fds:
            os.fstat(fd)
        return fds
    except (ValueError, OSError):
        env["MAKEFLAGS"] = _JOBSERVER_AUTH.sub("", flags)
        return ()


def pending(out: Path, targets: list[str], *, after_interrupt: bool = False) -> list[str] | None:
    """The commands a build of `targets` would run, in ninja's order (its dry run, `ninja -n -v`); [] for a
    no-op; None if ninja could not tell (a broken build.ninja: the real run will say why). `after_interrupt`:
    asked by the cleanup of a build Ctrl-C stopped, which must not stop again on that Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}  # a dry run takes no job slots
    p = subprocess.run([ninja_binary(), "-n", "-v", *targets], cwd=out, capture_output=True,
                       env={**env, "NINJA_STATUS": ""})
    if not after_interrupt:
        check_interrupt()
    if p.returncode != 0:
        return None
    lines = p.stdout.decode(errors="surrogateescape").splitlines()
    return [ln for ln in lines if not ln.startswith("ninja: ")]


def read_state(out: Path, name: str) -> dict[str, Any] | None:
    return read_json(out / STATE / name)
