"""qnn/isolated.py: a call in a forked child; its crash by a signal is an ActionError naming the signal, its
exceptions come back to the caller (issue 18 item 4; the real QNN crash is in test_legalize_real.py)."""
from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable

import pytest

from ctxbuild.errors import ActionError
from ctxbuild.qnn import isolated


def _quietly(crash: Callable[[], None]) -> Callable[[], None]:
    """In the child: pytest's faulthandler would print a 'Fatal Python error' dump past the capture (to the
    terminal) for a crash the test means; the parent's handler is untouched."""
    def child() -> None:
        faulthandler.disable()
        crash()
    return child


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.parametrize("fn, how", [(_quietly(_segfault), "signal 11, SIGSEGV"), (_quietly(os.abort), "signal 6, SIGABRT"),
                                     (lambda: os._exit(3), "exit 3")])
def test_a_crash_is_an_action_error(fn, how: str) -> None:
    with pytest.raises(isolated.Crashed) as e:
        isolated.call(fn, what="the QNN compiler", hint="report it")
    assert e.value.message == f"the QNN compiler crashed ({how})" and e.value.hint == "report it"


def test_exceptions_come_back() -> None:
    def fails(kind: str) -> None:
        if kind == "action":
            raise ActionError("bad node", "fix it")
        if kind == "os":
            raise FileNotFoundError(2, "No such file", "/x")
        raise ValueError("EP_FAIL: Failed to compose Qnn graph")

    with pytest.raises(ActionError) as e:
        isolated.call(fails, "action", what="w", hint="h")
    assert (e.value.message, e.value.hint) == ("bad node", "fix it")
    with pytest.raises(OSError) as o:
        isolated.call(fails, "os", what="w", hint="h")
    assert o.value.filename == "/x"
    with pytest.raises(RuntimeError, match="EP_FAIL: Failed to compose Qnn graph"):
        isolated.call(fails, "ort", what="w", hint="h")
    isolated.call(lambda: None, what="w", hint="h")  # a call that returns: nothing raised
