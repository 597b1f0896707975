"""Command line: `ctxbuild build|plan|targets|clean|schema|...`. Exit codes: 0 ok, 1 build failed, 2 bad input."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from ctxbuild.errors import CtxbuildError, UsageError, machine_limit
from ctxbuild.procs import interrupted, note_interrupt

if TYPE_CHECKING:
    from ctxbuild.engine.console import Console


INTERNAL = ("action", "worker", "regenerate")  # what ninja and the driver run: not in help, not suggested


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, formatter_class=argparse.RawDescriptionHelpFormatter, **kw)

    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep our one-line format
        typo = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if typo:
            from ctxbuild.recipes.suggest import did_you_mean

            public = [c for c in _commands(self) if c not in INTERNAL]
            raise UsageError(f"unknown command '{typo[1]}'",
                             did_you_mean(typo[1], public, otherwise=f"commands: {', '.join(public)}"))
        where = self.prog.removeprefix("ctxbuild").strip()  # main() prints "ctxbuild: error: " before it
        raise UsageError(f"{where + ': ' if where else ''}{message}", f"see `{self.prog} --help`")


def _commands(p: argparse.ArgumentParser) -> list[str]:
    return list(getattr(p, "subcommands", {}))


EXAMPLES = {
    "ctxbuild": """examples:
  ctxbuild build                       build recipes/ into out/ (what `make build` runs)
  ctxbuild -C firmware build -q        as make -C: run in firmware/, print only errors
  ctxbuild build --json > result.json  one JSON document with the results
  ctxbuild targets                     the SoCs, their aliases and device names
  ctxbuild completion bash > ~/.local/share/bash-completion/completions/ctxbuild""",
    "build": """examples:
  ctxbuild build                                   every recipe in recipes/ into out/
  ctxbuild build recipes/detector.yaml -o out      one recipe
  ctxbuild build --only detector --target SM8750   one recipe, one SoC
  ctxbuild build -n                                what would run (a dry run; also under `make -n`)
  ctxbuild build --json | jq .accuracy             results as JSON
  ctxbuild build --remote-cache http://cache:8080  share a cache between machines""",
    "verify": """examples:
  ctxbuild verify                        re-verify what was built (cached results reused)
  ctxbuild verify --layers detector      which layers lose the accuracy, and the likely fix""",
    "inspect": """examples:
  ctxbuild inspect out/SM8750/detector/detector_ctx.onnx
  ctxbuild inspect --json vendor_model.bin""",
    "wrap": """examples:
  ctxbuild wrap vendor_model.bin -o wrappers/   one EPContext model per graph of the binary""",
    "plan": """examples:
  ctxbuild plan --format dot | dot -Tsvg > plan.svg""",
    "completion": """examples:
  ctxbuild completion bash > ~/.local/share/bash-completion/completions/ctxbuild
  ctxbuild completion zsh > ~/.zfunc/_ctxbuild""",
}


def _common(p: argparse.ArgumentParser, *, default: Any) -> None:
    """-C, -v, -q: accepted before the command (`ctxbuild -q build`) and after it (`ctxbuild build -q`)."""
    p.add_argument("-C", dest="directory", type=Path, metavar="DIR", default=default,
                   help="change to DIR before doing anything (as make -C, git -C, ninja -C)")
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="more output: the commands ninja runs, failed edges' command lines")
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="errors only: no progress lines, no summary")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (a negative -j reached ninja, a --compile-jobs of -2 an
    invalid build.ninja)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    parse.__name__ = "count"
    return parse


def _size(text: str | None) -> int | None:
    from ctxbuild.units import parse_size

    return None if text is None else parse_size(text, "--memory-budget")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ctxbuild", description="Build QNN context binaries and EPContext models from recipes.",
                epilog=EXAMPLES["ctxbuild"])
    _common(p, default=None)
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print ctxbuild's version and the toolchain its action keys depend on, then exit")
    # Subcommands added without help= (action, worker, regenerate: what ninja and the driver run) are
    # left out of --help; the metavar keeps argparse from listing them in the usage line.
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    p.subcommands = sub.choices  # type: ignore[attr-defined]
    common = _Parser(add_help=False)
    _common(common, default=argparse.SUPPRESS)  # after the command: only when given, else the global value

    def command(name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's own keyword
        return sub.add_parser(name, help=help, parents=[common], epilog=EXAMPLES.get(name))

    b = command("build", "build recipes (default: recipes/) into OUT")
    _paths_out(b)
    b.add_argument("-j", "--jobs", type=_count(0), help="parallel actions (0: no limit; default: make's jobserver, else ninja's)")
    b.add_argument("-k", "--keep-going", type=_count(0), default=1, metavar="N", help="go on until N failures (0: all)")
    b.add_argument("--target", action="append", default=[], metavar="NAME", help="only this target (repeatable)")
    b.add_argument("--only", action="append", default=[], metavar="RECIPE", help="only this recipe (repeatable)")
    b.add_argument("--dry-run", "-n", action="store_true", help="show what would run")
    b.add_argument("--compile-jobs", type=_count(1), help="max concurrent compiles (default: from CPUs and memory)")
    b.add_argument("--memory-budget", metavar="SIZE", help="memory concurrent actions may use, e.g. 16G "
                   "(default: what is available when the build starts)")
    b.add_argument("--explain", action="store_true", help="say why each action ran or was restored")
    b.add_argument("--no-verify", action="store_true", help="skip simulator verification of the artifacts")
    b.add_argument("--json", action="store_true", help="print one JSON document with the results on stdout "
                   "(progress goes to stderr)")
    _cache_args(b)
    _executor_args(b)

    v = command("verify", "run only the verification of built artifacts (cached results reused)")
    _paths_out(v)
    v.add_argument("-j", "--jobs", type=_count(0), help="parallel actions (0: no limit; default: make's jobserver, else ninja's)")
    v.add_argument("--layers", metavar="RECIPE", help="diagnose RECIPE per layer: quantization vs HTP loss")
    v.add_argument("--target", action="append", default=[], metavar="NAME", help="with --layers: only this target")
    v.add_argument("--samples", type=_count(1), metavar="N", help="with --layers: samples to run (default: verify's)")
    v.add_argument("--json", action="store_true", help="print one JSON document with the results on stdout")
    _cache_args(v)
    _executor_args(v)

    i = command("inspect", "describe a context binary (.bin) or EPContext model (_ctx.onnx)")
    i.add_argument("file", type=Path, help="a context binary, or an EPContext model (followed to its binary)")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")

    w = command("wrap", "write EPContext wrappers for every graph of a context binary")
    w.add_argument("file", type=Path, help="the context binary (.bin) to wrap")
    w.add_argument("-o", "--out", type=Path, default=Path("."), help="directory for the wrappers (default: .)")
    w.add_argument("--embed", action="store_true", help="embed the binary in each wrapper")
    w.add_argument("--quantized-io", action="store_true", help="expose the graph's integer I/O (no Q/DQ)")

    ck = command("check", "deploy gate: will OUT's wrappers load on a device runtime (and SoC)?")
    ck.add_argument("path", type=Path, help="a build's output directory (its manifest.json), or one _ctx.onnx")
    ck.add_argument("--runtime", action="append", required=True, metavar="KEY=VERSION[,...]",
                    help="the devices' runtime: qairt=2.47 or onnxruntime-qnn=2.3.0, optionally ,onnxruntime=1.24.4 "
                         "(default: 1.24, the oldest the QNN EP runs on); repeatable")
    ck.add_argument("--soc", metavar="NAME", help="the devices' SoC (default: the SoCs each artifact was built for)")
    ck.add_argument("--json", action="store_true", help="print JSON instead of a table")

    tl = command("toolchain", "toolchains: list those provisioned, provision one ahead (offline use)")
    tsub = tl.add_subparsers(dest="toolchain_cmd", required=True, parser_class=_Parser)
    tls = tsub.add_parser("list", help="the provisioned toolchains and the published releases")
    tls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tp = tsub.add_parser("provision", help="provision a toolchain now (pip; $CTXBUILD_WHEELHOUSE for offline)")
    tp.add_argument("spec", help="an onnxruntime-qnn release (2.3.0) or qairt=2.47")

    pl = command("plan", "print the action graph")
    _paths_out(pl)
    pl.add_argument("--format", choices=["text", "json", "dot"], default="text",
                    help="text (default), json (actions and edges) or dot (Graphviz)")

    t = command("targets", "list known SoCs")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")

    c = command("clean", "remove what ctxbuild wrote into OUT")
    c.add_argument("-o", "--out", type=Path, default=Path("out"), help="output directory (default: out)")

    command("schema", "print the recipe JSON Schema")

    ca = command("cache", "local cache: stats, gc, clear")
    csub = ca.add_subparsers(dest="cache_cmd", required=True, parser_class=_Parser)
    cs = csub.add_parser("stats", help="entries, size, and the last build's hits and misses")
    cs.add_argument("--json", action="store_true", help="print JSON instead of text")
    cg = csub.add_parser("gc", help="evict least recently used entries down to a size")
    cg.add_argument("--max-size", required=True, metavar="SIZE", help="e.g. 500M, 2G, 1GiB or a byte count")
    cc = csub.add_parser("clear", help="remove every entry")
    for c in (cs, cg, cc):
        c.add_argument("--cache-dir", type=Path, help="local cache (default: $CTXBUILD_CACHE_DIR or XDG cache)")

    co = command("completion", "print a shell completion script (bash, zsh, tcsh)")
    co.add_argument("shell", choices=["bash", "zsh", "tcsh"], help="the shell")

    a = sub.add_parser("action", description="internal: run one action (what a ninja edge runs)")
    a.add_argument("spec", help="the action's spec file (OUT/.ctxbuild/actions/<id>.json)")
    w = sub.add_parser("worker", description="internal: the fork server that runs actions")
    w.add_argument("listen_fd", type=int, help="the listening unix socket inherited from the driver (a file descriptor)")
    r = sub.add_parser("regenerate", description="internal: re-plan OUT/build.ninja (ninja's generator edge)")
    r.add_argument("out", type=Path, help="the output directory")
    return p


class _Version(argparse.Action):
    """`ctxbuild --version`: like `ninja --version` or `ccache -V`, plus what the action keys depend on."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from ctxbuild import __version__
        from ctxbuild.toolchain import installed as toolchain

        print(f"ctxbuild {__version__}")
        for name, value in toolchain.summary(None).items():
            print(f"  {name:<17} {value}")
        parser.exit()


def _paths_out(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", type=Path, default=[Path("recipes")], metavar="PATHS",
                   help="recipe files or directories (searched for *.yaml; default: recipes)")
    p.add_argument("-o", "--out", type=Path, default=Path("out"), help="output directory (default: out)")


def _cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-cache", action="store_true", help="bypass the action cache")
    p.add_argument("--cache-dir", type=Path, help="local cache (default: $CTXBUILD_CACHE_DIR or XDG cache)")
    p.add_argument("--remote-cache", metavar="URL", help="HTTP cache with /ac and /cas (or $CTXBUILD_REMOTE_CACHE)")
    p.add_argument("--remote-read-only", action="store_true", help="never upload (untrusted builds)")
    p.add_argument("--remote-max-download", metavar="SIZE", help="the most one remote blob download may bring, "
                   "e.g. 64G (default 32GiB; or cache.max_download)")


def _executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", metavar="ADDRESS",
                   help="run actions on a Dask cluster, e.g. tcp://host:8786 (or $CTXBUILD_EXECUTOR; default: local)")
    p.add_argument("--executor-fallback", choices=["fail", "local"],
                   help="if the cluster is unreachable: fail (default) or build locally ($CTXBUILD_EXECUTOR_FALLBACK)")


def _cache_env(args: argparse.Namespace) -> dict[str, str]:
    """Cache settings reach ninja's action processes through the environment (not build.ninja: no rebuilds)."""
    env: dict[str, str] = {}
    if args.no_cache:
        env["CTXBUILD_NO_CACHE"] = "1"
    if args.cache_dir:
        env["CTXBUILD_CACHE_DIR"] = str(args.cache_dir.resolve())
    if args.remote_cache:
        env["CTXBUILD_REMOTE_CACHE"] = args.remote_cache
    if args.remote_read_only:
        env["CTXBUILD_REMOTE_READ_ONLY"] = "1"
    if args.remote_max_download:
        from ctxbuild.units import parse_size

        env["CTXBUILD_REMOTE_MAX_DOWNLOAD"] = str(parse_size(args.remote_max_download, "--remote-max-download"))
    return env


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.directory is not None:
            _chdir(args.directory)
        if args.cmd not in ("action", "worker"):  # those two have their own signal handling
            catch_ctrl_c()
        code = _dispatch(args)
        return _interrupted() if interrupted() else code  # a Ctrl-C whose KeyboardInterrupt was lost
    except KeyboardInterrupt:
        return _interrupted()
    except CtxbuildError as e:
        if interrupted():  # e.g. a failure caused by the interrupt itself
            return _interrupted()
        print(f"ctxbuild: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # `ctxbuild targets | head`: entry() handles it
        raise
    except OSError as e:  # a full or read-only OUT, outside any action: one line, not a traceback
        if interrupted():
            return _interrupted()
        line = machine_limit(e) or f"{e.filename + ': ' if e.filename else ''}{e.strerror or e}"
        print(f"ctxbuild: error: {line}", file=sys.stderr)
        return 1
    except Exception as e:
        if interrupted():  # an interrupt inside an import can surface as ImportError
            return _interrupted()
        if line := machine_limit(e):  # e.g. the toolchain probe's compile under `ulimit -f`
            print(f"ctxbuild: error: {line}", file=sys.stderr)
            return 1
        raise


def catch_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt wherever Python is. Where that is a weakref callback or a __del__ (the
    garbage collector runs them inside any allocation: planning imports networkx and jsonschema), Python
    cannot raise it: it printed 'Exception ignored in ... Traceback ... KeyboardInterrupt' and went on. The
    flag is set either way (the driver checks it before ninja and at the end: exit 130), so such a lost
    interrupt is dropped quietly; every other unraisable exception still goes to Python's own hook."""
    signal.signal(signal.SIGINT, _on_sigint)
    default = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (isinstance(unraisable.exc_value, KeyboardInterrupt) and interrupted()):
            default(unraisable)

    sys.unraisablehook = hook


def _chdir(directory: Path) -> None:
    """-C DIR: every relative path on the command line (recipes, -o, --cache-dir) is then relative to DIR."""
    try:
        os.chdir(directory)
    except OSError as e:
        raise UsageError(f"-C {directory}: {e.strerror}", "give an existing directory") from None


def _console(args: argparse.Namespace) -> Console:
    from ctxbuild.engine.console import Console

    return Console(quiet=bool(args.quiet), verbose=bool(args.verbose), json=bool(getattr(args, "json", False)))


def _on_sigint(signum: int, frame: object) -> None:
    note_interrupt()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # one is enough: the cleanup on the way out runs undisturbed
    raise KeyboardInterrupt


def _interrupted() -> int:
    print("ctxbuild: interrupted", file=sys.stderr)
    return 130


def _dispatch(args: argparse.Namespace) -> int:
    for p in getattr(args, "paths", []):  # before OUT's placement is judged against a file that is not there
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory", "give recipe files or directories")
    if args.cmd == "action":
        from ctxbuild.engine.client import main as run_client

        return run_client([args.spec])
    if args.cmd == "worker":
        from ctxbuild.engine.worker import serve

        code = 0
        try:
            serve(args.listen_fd)
        except KeyboardInterrupt:  # before serve() ignores SIGINT
            code = 130
        except BaseException:  # noqa: BLE001 - reported here, then the same way out
            import traceback

            traceback.print_exc()
            code = 1
        # Not through the interpreter's exit: onnxruntime's static destructors, run after the EP was
        # registered here, were seen to hang forever (pthread_cond_destroy) and leave the worker behind.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.cmd == "build":
        from ctxbuild.engine.build import build
        from ctxbuild.engine.options import BuildOptions

        return build(BuildOptions(paths=args.paths, out=args.out, jobs=args.jobs, keep_going=args.keep_going,
                                  targets=args.target, only=args.only, dry_run=args.dry_run,
                                  compile_jobs=args.compile_jobs, explain=args.explain, verify=not args.no_verify,
                                  cache_env=_cache_env(args), memory_budget=_size(args.memory_budget),
                                  executor=args.executor, executor_fallback=args.executor_fallback,
                                  console=_console(args)))
    if args.cmd == "verify" and args.layers:
        from ctxbuild.cli.layers import main as layers

        return layers(args.paths, args.out, args.layers, args.target, samples=args.samples,
                      cache_env=_cache_env(args))
    if args.cmd == "verify":
        from ctxbuild.engine.build import build
        from ctxbuild.engine.options import BuildOptions

        return build(BuildOptions(paths=args.paths, out=args.out, jobs=args.jobs, verify_only=True,
                                  cache_env=_cache_env(args), executor=args.executor,
                                  executor_fallback=args.executor_fallback, console=_console(args)))
    if args.cmd == "inspect":
        from ctxbuild.qnn.contextbin import describe, format_text

        info = describe(args.file)
        print(json.dumps(info, indent=2) if args.json else format_text(info))
        return 0
    if args.cmd == "wrap":
        from ctxbuild.qnn.wrap import wrap_binary

        for p in wrap_binary(args.file, args.out, embed=args.embed, quantized_io=args.quantized_io):
            print(p)
        return 0
    if args.cmd == "check":
        from ctxbuild.outputs.gate import WILL_NOT_LOAD, check, table
        from ctxbuild.toolchain.runtimes import parse_cli

        rows = check(args.path, [parse_cli(r) for r in args.runtime], args.soc)
        print(json.dumps(rows, indent=2) if args.json else table(rows))
        return 1 if any(r["verdict"] == WILL_NOT_LOAD for r in rows) else 0
    if args.cmd == "toolchain":
        from ctxbuild.cli.toolchains import main as toolchain_main

        return toolchain_main(args)
    if args.cmd == "regenerate":
        from ctxbuild.engine.replan import regenerate

        regenerate(args.out)
        return 0
    if args.cmd == "plan":
        return _plan(args)
    if args.cmd == "targets":
        return _targets(args.json)
    if args.cmd == "clean":
        return _clean(args.out)
    if args.cmd == "cache":
        from ctxbuild.cli.cache import main as cache_main

        return cache_main(args)
    if args.cmd == "completion":
        import shtab

        sys.stdout.write(shtab.complete(_parser(), shell=args.shell))
        return 0
    if args.cmd == "schema":
        from ctxbuild.recipes.recipe import SCHEMA_PATH

        sys.stdout.write(SCHEMA_PATH.read_text())
        return 0
    raise UsageError(f"unknown command {args.cmd}")


def _plan(args: argparse.Namespace) -> int:
    from ctxbuild.recipes import recipe
    from ctxbuild.plan.planner import make_plan

    plan = make_plan(recipe.load(args.paths), args.out)
    actions = plan.actions
    if args.format == "json":
        print(json.dumps({"actions": [a.to_spec() for a in actions],
                          "edges": [{"from": u, "to": v, "files": d["files"]} for u, v, d in plan.graph.edges(data=True)]},
                         indent=2))
    elif args.format == "dot":
        print("digraph ctxbuild {\n  rankdir=LR;")
        for a in actions:
            print(f'  "{a.id}" [label="{a.description}"];')
        for u, v in plan.graph.edges():
            print(f'  "{u}" -> "{v}";')
        print("}")
    else:
        for a in actions:
            deps = sorted(plan.graph.predecessors(a.id))
            print(f"{a.id}  [{', '.join(a.recipes)}]" + (f"  <- {', '.join(deps)}" if deps else ""))
    return 0


def _targets(as_json: bool) -> int:
    from ctxbuild.recipes.targets import SOCS

    if as_json:
        print(json.dumps([{"name": s.name, "soc_model": s.soc_model, "htp_arch": s.htp_arch, "vtcm_mb": s.vtcm_mb,
                           "aliases": list(s.aliases), "marketing_name": s.marketing, "devices": list(s.devices)}
                          for s in SOCS], indent=2))
        return 0
    print(f"{'name':<10} {'soc_model':>9} {'htp_arch':>8} {'vtcm_mb':>7}  aliases / marketing name / devices")
    for s in SOCS:
        print(f"{s.name:<10} {s.soc_model:>9} {'v' + str(s.htp_arch):>8} {s.vtcm_mb:>7}  "
              f"{', '.join(s.aliases) + ' / ' if s.aliases else ''}{s.marketing}"
              f"{' / ' + ', '.join(s.devices) if s.devices else ''}")
    return 0


def _clean(out: Path) -> int:
    from ctxbuild.engine.outdir import clean

    clean(out)
    return 0


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `ctxbuild targets | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    if code == 130:
        # Interrupted. CPython remembers a KeyboardInterrupt that once escaped code it ran via PyRun_* (some
        # library imports do) and then ends itself with SIGINT at exit (-2, measured 3 in 40 Ctrl-Cs while
        # planning), whatever we return. Our cleanup is done: leave with our exit code.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
