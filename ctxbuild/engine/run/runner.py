"""Run one action (what a ninja edge executes): key it, restore from cache or run it, place outputs atomically.

Protocol with the driver: the spec file names everything; the record file written last
(OUT/.ctxbuild/records/<id>.json) tells the driver and `--explain` what happened and why.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ctxbuild import machine, settings
from ctxbuild.plan import actionkey, kinds, memory
from ctxbuild.plan.action import Action, load_spec
from ctxbuild.atomic import read_json, write_bytes
from ctxbuild.cache.backends import open_cache
from ctxbuild.capture import captured
from ctxbuild.digests import DigestMemo, canonical_json, sha256_file
from ctxbuild.errors import ActionError, cause_line, CtxbuildError, machine_limit
from ctxbuild.layout import STATE, depfile_path, log_path, record_path, rel, spec_name
from ctxbuild.engine.ninjaquote import depfile_path as depfile_quote
from ctxbuild.engine.owner import confined
from ctxbuild.verify import gates


class ActionContext:
    """What an action implementation gets: its spec, a private temp dir, and where to write outputs."""

    def __init__(self, action: Action, out: Path, tmp: Path, log_path: Path) -> None:
        self.action = action
        self.out = out
        self.tmp = tmp
        self.log_path = log_path  # the EP logs here (fd 2 is captured); actions parse it for causes
        self.facts: dict[str, Any] = {}  # measurements of this run (timings) for the record, not the outputs
        self.cache: Any = None  # the build cache (None when off): verify memoizes simulator outputs in it
        self.key_components: dict[str, Any] = {}  # the action key's parts: input digests already computed

    def tmp_output(self, role: str) -> Path:
        """Temp path with the output's final file name (a _ctx.onnx names its bin by file name)."""
        return self.tmp / Path(self.action.outputs[role]).name


def out_dir_of(spec_path: Path) -> Path:
    return spec_path.resolve().parent.parent.parent  # OUT/.ctxbuild/actions/<id>.json


def main(spec_arg: str) -> int:
    spec_path = Path(spec_arg)
    out = out_dir_of(spec_path)
    action = load_spec(spec_path)
    if stray := confined(list(action.outputs.values()), out):  # nothing written, nothing removed
        print(f"ctxbuild: error: {action.id}: its spec writes {stray}, outside {out}: OUT was moved or copied; "
              f"run `ctxbuild build -o {out}` once to re-bind it here", file=sys.stderr)
        return 1
    if action.toolchain is not None:
        _enter_toolchain(action.toolchain, spec_arg)
    kind = kinds.get(action.kind)
    log = log_path(out, action.id)
    record_file = record_path(out, action.id)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    record = new_record(action, settings.BUILD_ID.get())
    previous = read_json(record_file)
    memo = DigestMemo(out / STATE / "digests.sqlite")
    tmp = out / STATE / "tmp" / f"{action.spec_name[:-5]}.{os.getpid()}"
    cache = None
    try:
        with captured(log):
            cache = open_cache()
            if cache:
                cache.warnings += carried_warnings(out, action.id, record["build_id"])
            known, summary = _restore_or_run(action, kind, out, tmp, log, memo, cache, previous, record)
        shown = complete_record(action, out, record, known, memo, cache, summary)
        if cache and not settings.BUILD_ID.get():  # run alone (plain `ninja`, `ctxbuild action`): no driver prints them
            shown += record["cache_warnings"]
        for w in shown:
            print(f"ctxbuild: warning: {w}", file=sys.stderr)
    except CtxbuildError as e:
        record.update(status="failed", cause=str(e))
        if e.exit_code != 1:  # a recipe's mistake found while building (a node name the model lacks): exit 2
            record["exit_code"] = e.exit_code
        if details := getattr(e, "details", None):  # e.g. a failed verification's metrics
            record["result"] = details
    except Exception as e:  # an action's bug or a library failure: still one clean failure of this edge
        cause = machine_limit(e)  # a full disk or a file-size limit: the cause says it all, no traceback
        try:
            if cause is None:
                with open(log, "a") as f:
                    traceback.print_exc(file=f)
        except OSError:  # a full disk: the cause below still says what happened
            pass
        record.update(status="failed", cause=cause or f"{type(e).__name__}: {cause_line(e)}")
    finally:
        record["seconds"] = round(time.monotonic() - start, 3)
        record["peak_rss"] = machine.peak_rss()
        record["finished"] = time.time()
        record["log"] = str(log.relative_to(out))
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            write_bytes(record_file, canonical_json(record), durable=False)
        except OSError as e:  # a full OUT: the action fails with one line (the driver finds no record)
            record.update(status="failed", cause=f"cannot write its record: {e.strerror}")
        memo.close()
    if record["status"] == "ok":
        return 0
    _remove_outputs(action)  # a failed action leaves no output behind, not even an older one
    _print_failure(action, log, record["cause"])
    return 1


def _restore_or_run(action: Action, kind: type[kinds.Kind], out: Path, tmp: Path, log: Path, memo: DigestMemo,
                    cache: Any, previous: dict[str, Any] | None, record: dict[str, Any]) -> tuple[Any, dict | None]:
    """Key the action, then restore its outputs from the cache or run it and store them. Returns the cache
    record when the cache hashed the placed outputs (restored or stored), else None, and the summarize
    hook's result when the action ran here (it goes into the cache record: a restore need not load the
    outputs again to make it)."""
    start = time.monotonic()
    discovered = actionkey.discover(action, memo)
    key, components = action_key(action, out, memo, discovered)
    note_key(record, key, components, previous)
    dests = {r: Path(p) for r, p in action.outputs.items()}
    hit = cache.lookup(key) if cache else None
    restored = hit is not None and cache.restore(hit, dests)
    if restored and not restored_ok(action, kind, cache):
        cache.rejected.add(key)  # a poisoned entry: what this run makes replaces it
        restored = False
    if restored:
        record["source"] = "cache"
        record["cache_origin"] = "remote" if cache.hits_remote else "local"
        record["original_seconds"] = hit.meta.get("seconds")  # what the work cost when it ran
        sys.stdout.flush()
        os.write(1, restored_log(action, key, cache, hit))
        return hit, None
    farm = _run_on_farm(action, key, components, discovered, cache, out)
    if farm is not None and restored_ok(action, kind, cache):  # ran on the cluster, restored from the cache
        record.update(farm.info)
        record["source"] = "run"
        record["cache_origin"] = "farm"
        return farm.record, None
    need = _memory_estimate(action)
    record["memory_estimate"] = need
    machine.check_fits(need)
    tmp.mkdir(parents=True, exist_ok=True)
    ctx = ActionContext(action, out, tmp, log)
    ctx.cache, ctx.key_components = cache, components
    try:
        kind.module().run(ctx)
    finally:
        record.update(ctx.facts)
    kind.hook("check_outputs")(action, {r: tmp / Path(p).name for r, p in action.outputs.items()})
    _check_inputs_unchanged(action, discovered, memo, out, components)
    _place_outputs(action, tmp)
    record["source"] = "run"
    record["cache_origin"] = None if cache else "off"
    summary = kind.hook("summarize")(action)
    if not cache:
        return None, summary
    return cache.store(key, dests, log.read_bytes(), {"id": action.id, "seconds": round(time.monotonic() - start, 3),
                                                      "summary": summary}), summary


def restored_ok(action: Action, kind: type[kinds.Kind], cache: Any) -> bool:
    """Restored outputs get the same check as fresh ones: a poisoned record is a miss, and the action runs."""
    try:
        kind.hook("check_outputs")(action, {r: Path(p) for r, p in action.outputs.items()})
        return True
    except ActionError as e:
        cache.warnings.append(f"cache entry rejected: {e}; rebuilding")
        _remove_outputs(action)
        return False


def _check_inputs_unchanged(action: Action, discovered: dict[str, Path], memo: DigestMemo, out: Path,
                            components: dict[str, Any]) -> None:
    """Inputs hashed again after the run (a stat each, unless one changed): outputs made from an input edited
    while the action ran would be stored under the old content's key and handed to every later build of it."""
    try:
        after = actionkey.components(action, discovered, memo, out / STATE)
    except OSError as e:
        raise ActionError(f"{action.description}: an input went away while it ran ({e.filename}); "
                          "nothing was stored, build again") from None
    changed = [f"{role} ({path})" for group, paths in (("inputs", action.inputs), ("discovered_inputs", discovered))
               for role, path in sorted(paths.items()) if after[group][role] != components[group][role]]
    if changed:
        raise ActionError(f"{action.description}: input {', '.join(changed)} changed while it ran; its outputs "
                          "were not placed or stored, build again")


def _memory_estimate(action: Action) -> int:
    """The worker's estimate (it scheduled this action by it), else our own (run without a worker)."""
    given = settings.MEMORY_ESTIMATE.get()
    return memory.estimate(action) if given is None else given


def record_crash(spec: Path, build_id: str | None, signum: int) -> None:
    """The failed record of an action whose process a signal killed before it wrote its own (the fork server
    calls this): the signal, what likely sent it, and the log the action had written so far."""
    import signal

    out = out_dir_of(spec)
    action = load_spec(spec)
    record_file = record_path(out, action.id)
    mine = read_json(record_file)
    if mine and mine.get("build_id") == build_id and mine.get("status"):
        return  # it got as far as writing its record: the signal came after
    try:
        name = signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        name = f"signal {signum}"
    hint = ("the kernel's OOM killer, or a kill from outside: check the machine's free memory, lower -j or "
            "--memory-budget" if signum == signal.SIGKILL else
            "a crash in native code (QNN, onnxruntime): the log's last lines show where; report it with the model")
    record = {**new_record(action, build_id), "status": "failed", "signal": name, "finished": time.time(),
              "cause": f"the action process was killed by {name} ({hint})",
              "log": str(log_path(out, action.id).relative_to(out))}
    write_bytes(record_file, canonical_json(record), durable=False)
    _remove_outputs(action)


def new_record(action: Action, build_id: str | None) -> dict[str, Any]:
    return {"id": action.id, "kind": action.kind, "recipes": action.recipes, "target": action.target,
            "build_id": build_id, "started": time.time()}


def note_key(record: dict[str, Any], key: str, components: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """The key, its components, and which of them changed since `previous` (this action's last record)."""
    record.update(key=key, key_detail=components)
    record["why"] = actionkey.why(previous, record)


def action_key(action: Action, out: Path, memo: DigestMemo,
               discovered: dict[str, Path] | None = None) -> tuple[str, dict[str, Any]]:
    """The action key and its components; files found at run time (`discovered`: already found) also go to
    ninja's depfile."""
    if discovered is None:
        discovered = actionkey.discover(action, memo)
    _write_depfile(out, action, discovered)
    components = actionkey.components(action, discovered, memo, out / STATE)
    return actionkey.digest(components), components


def restored_log(action: Action, key: str, cache: Any, hit: Any) -> bytes:
    """What a restored action's log holds: a line saying so, then the log of the run that was cached."""
    head = f"restored {action.id} from cache (key {key[:16]}); the original log follows\n".encode()
    return head + (cache.read_log(hit) or b"")


def complete_record(action: Action, out: Path, record: dict[str, Any], known: Any, memo: DigestMemo,
                    cache: Any, summary: dict[str, Any] | None = None) -> list[str]:
    """Fill in a succeeded action's record (outputs, summary, warnings); returns the warnings to show.
    `known`: the cache record whose digests the placed outputs were checked against, if any; `summary`:
    the summarize hook's result if known (computed when the action ran, or kept in that cache record)."""
    hashed = {e.name: (e.digest, e.size) for e in known.outputs} if known is not None else {}
    record["outputs"] = {r: _describe_output(Path(p), out, hashed.get(r)) for r, p in action.outputs.items()}
    for r, p in action.outputs.items():  # consumers later in this build need not hash them again
        memo.remember(Path(p), record["outputs"][r]["sha256"])
    if summary is None and known is not None and isinstance(known.meta.get("summary"), dict):
        summary = known.meta["summary"]
    record.update(kinds.get(action.kind).hook("summarize")(action) if summary is None else summary)
    record["status"] = "ok"
    if gates.closed(action.inputs):  # a precision-search candidate an earlier one made unneeded: placeholders only
        record["not_needed"] = True  # neither built nor restored work: progress, counts and the report leave it out
    # the summary's warnings were found when the action ran (kept with its cache entry), the hook's on every build
    record["warnings"] = [*record.pop("warnings", []), *kinds.get(action.kind).hook("warnings")(action)]
    if cache:  # the driver prints each distinct one once at the end (one per action was 24 lines of the same)
        record["cache_warnings"] = cache.warnings
    return list(record["warnings"])


def carried_warnings(out: Path, action_id: str, build_id: str | None, warnings: list[str] | None = None) -> list[str]:
    """Cache warnings met for this action earlier in the same build (prerestore.py's look-ahead, whose miss
    left it to ninja): given `warnings`, store them; else return and forget what was stored."""
    path = out / STATE / "carried" / spec_name(action_id)
    if warnings is not None:
        write_bytes(path, canonical_json({"build_id": build_id, "warnings": warnings}), durable=False)
        return warnings
    data = read_json(path)
    path.unlink(missing_ok=True)
    return data["warnings"] if data and data.get("build_id") == build_id else []


def _run_on_farm(action: Action, key: str, components: dict[str, Any], discovered: dict[str, Path], cache: Any,
                 out: Path) -> Any:
    """On a build with an executor: run on the cluster, outputs restored from the cache; else None."""
    if not settings.FARM.get():
        return None
    from ctxbuild.engine.farm.submit import run_on_farm

    return run_on_farm(action, key, components, discovered, cache, out)


def _enter_toolchain(name: str, spec_arg: str) -> None:
    """Run in the action's toolchain: return if this process is in it (its worker's children are), else
    re-execute `ctxbuild action SPEC` in it, same pid (plain `ninja` in OUT, a farm worker), provisioning it
    first if this machine has not yet."""
    from ctxbuild.toolchain import choose, provision

    tc = choose.by_name(name)
    if provision.active(tc):  # a worker's child: its environment is the client's; its own children need the site
        os.environ.update(provision.env_for(tc, {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}))
        return
    provision.ensure(tc, say=lambda line: print(line, file=sys.stderr))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "ctxbuild", "action", spec_arg], provision.env_for(tc))


def _place_outputs(action: Action, tmp: Path) -> None:
    """Move each output into place atomically; an identical existing file is left alone (ninja restat)."""
    for path in action.outputs.values():
        dest, src = Path(path), tmp / Path(path).name
        if not src.is_file():
            raise ActionError(f"{action.description}: produced no {dest.name}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_file() and dest.stat().st_size == src.stat().st_size and sha256_file(dest) == sha256_file(src):
            continue
        os.replace(src, dest)


def _remove_outputs(action: Action) -> None:
    for p in action.outputs.values():
        Path(p).unlink(missing_ok=True)


def _describe_output(p: Path, out: Path, hashed: tuple[str, int] | None = None) -> dict[str, Any]:
    """`hashed`: the digest the cache verified while restoring or storing this very file (one read fewer)."""
    size = p.stat().st_size
    digest = hashed[0] if hashed is not None and hashed[1] == size else sha256_file(p)
    return {"path": str(p.relative_to(out)), "sha256": digest, "size": size}


def _write_depfile(out: Path, action: Action, discovered: dict[str, Path]) -> None:
    """Files found at run time (external data, calibration samples) become ninja dependencies (deps = gcc)."""
    if not kinds.get(action.kind).discovers_inputs:
        return
    outs = " ".join(depfile_quote(rel(p, out)) for p in action.outputs.values())
    deps = " ".join(depfile_quote(str(p)) for p in discovered.values())
    write_bytes(depfile_path(out, action.id), f"{outs}: {deps}\n".encode(), durable=False)


_NOISE = ("File mapped weights feature", "EPContext encryption config", "LIBNATIVE", "Please consider",
          "pre-processing before quantization")


def _print_failure(action: Action, log_path: Path, cause: str) -> None:
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if not any(n in ln for n in _NOISE)]
    except OSError:
        lines = []
    if lines:
        print(f"--- log of {action.description} ({log_path}), last lines:", file=sys.stderr)
        print("\n".join(lines[-15:]), file=sys.stderr)
    if not settings.BUILD_ID.get():  # under `ctxbuild build` the driver names the failure, once
        print(f"error: {action.description}: {cause}", file=sys.stderr)

