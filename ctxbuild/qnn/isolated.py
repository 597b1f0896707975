"""Run a QNN call (a compile) in a forked child: a crash of the vendor library (SIGSEGV, abort) then fails only
that call, as an ActionError naming the signal, and the action still writes its record, its FAILED line and
cleans up its staging (a crashed action process lost all three)."""
from __future__ import annotations

import signal
from typing import Any, Callable

from ctxbuild.errors import ActionError


class Crashed(ActionError):
    """The child died by a signal."""


def call(fn: Callable[..., None], *args: Any, what: str, hint: str, **kwargs: Any) -> None:
    """fn(*args, **kwargs) in a fork of this process (the EP registered here is inherited); its exception is
    raised here (ActionError, OSError and MemoryError as such, any other as a RuntimeError with its message),
    its death by a signal or exit as Crashed."""
    import multiprocessing

    mp = multiprocessing.get_context("fork")
    recv, send = mp.Pipe(duplex=False)
    child = mp.Process(target=_child, args=(fn, args, kwargs, send), daemon=True)
    child.start()
    send.close()
    try:
        result = recv.recv()
    except EOFError:  # the child died before answering
        result = None
    child.join()
    if result is None:
        code = child.exitcode or 0
        how = f"signal {-code}, {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        raise Crashed(f"{what} crashed ({how})", hint)
    if isinstance(result, BaseException):
        raise result


def _child(fn: Callable[..., None], args: tuple, kwargs: dict, send: Any) -> None:
    import sys

    out: Any = "ok"
    try:
        fn(*args, **kwargs)
    except ActionError as e:
        out = ActionError(e.message, e.hint)
    except OSError as e:
        out = OSError(e.errno, e.strerror, e.filename)
    except MemoryError as e:
        out = MemoryError(str(e))
    except BaseException as e:  # noqa: BLE001 - ORT's own exception types need not pickle: their message does
        out = RuntimeError(str(e))
    sys.stderr.flush()
    send.send(out)
    send.close()
