"""`ctxbuild worker FD` (internal): the fork server the driver starts for a build (engine/run/worker.py)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from ctxbuild.cli.parser import Command


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("listen_fd", type=int, help="the listening unix socket inherited from the driver (a file descriptor)")


def run(args: argparse.Namespace) -> NoReturn:
    from ctxbuild.engine.run.worker import serve

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


COMMAND = Command("worker", None, arguments, run, description="internal: the fork server that runs actions",
                  ctrl_c=False)
