"""The command table: one module per command declares its arguments and its handler (a `Command`); this list
is what the parser, `--help`, the "did you mean" and the completion scripts are made from, in this order.
Adding a command: a module here and a line in COMMANDS."""
from ctxbuild.cli.commands import (action, build, cache, check, clean, completion, inspect, plan, regenerate,
                                   schema, targets, toolchain, verify, worker, wrap)
from ctxbuild.cli.parser import Command

COMMANDS: list[Command] = [
    build.COMMAND,
    verify.COMMAND,
    inspect.COMMAND,
    wrap.COMMAND,
    check.COMMAND,
    toolchain.COMMAND,
    plan.COMMAND,
    targets.COMMAND,
    clean.COMMAND,
    schema.COMMAND,
    cache.COMMAND,
    completion.COMMAND,
    action.COMMAND,  # the internal ones: what ninja and the driver run
    worker.COMMAND,
    regenerate.COMMAND,
]
