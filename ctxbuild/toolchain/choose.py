"""Which toolchain builds a recipe: the one ctxbuild is installed with, or a published onnxruntime-qnn release
chosen by version or by the devices' runtime (the newest release whose QAIRT is not newer).

A toolchain other than the installed one is an exact pin of onnxruntime-qnn and onnxruntime, provisioned on
demand (toolchain/provision.py). Choosing is by version, never by trying: a runtime no published release
serves is a recipe error, never a silent fallback to another toolchain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxbuild.errors import UsageError
from ctxbuild.toolchain.runtimes import PUBLISHED, parse_version, runtime

# The onnxruntime every provisioned toolchain runs with: the oldest the plugin EP supports (every release
# requires onnxruntime>=1.24.2), measured with onnxruntime-qnn 2.3.0. Wrappers are lowered for it anyway.
ONNXRUNTIME = "1.24.4"
INSTALLED = "installed"


@dataclass(frozen=True)
class Toolchain:
    """A provisioned toolchain: onnxruntime-qnn `plugin` (which fixes the QAIRT) with onnxruntime `onnxruntime`."""

    plugin: str
    onnxruntime: str = ONNXRUNTIME

    @property
    def name(self) -> str:  # a directory name under the user cache, and what action specs carry
        return f"onnxruntime-qnn-{self.plugin}"

    @property
    def qairt(self) -> str:
        return PUBLISHED[self.plugin]

    @property
    def label(self) -> str:
        return f"onnxruntime-qnn {self.plugin} (QAIRT {self.qairt}), onnxruntime {self.onnxruntime}"

    @property
    def suffix(self) -> str:  # a recipe variant's name for this toolchain: <recipe>-qairt-2.47.0
        return f"qairt-{self.qairt}"

    @property
    def pins(self) -> list[str]:
        return [f"onnxruntime=={self.onnxruntime}", f"onnxruntime-qnn=={self.plugin}"]


def by_name(name: str) -> Toolchain:
    """The inverse of Toolchain.name (an action spec's `toolchain`)."""
    plugin = name.removeprefix("onnxruntime-qnn-")
    if plugin not in PUBLISHED or name == plugin:
        raise UsageError(f"toolchain {name!r} is not onnxruntime-qnn-X.Y.Z of a published release",
                         f"known: {', '.join(PUBLISHED)}")
    return Toolchain(plugin)


def choose(spec: Any, where: str, installed_plugin: str) -> Toolchain | None:
    """The toolchain a recipe's `toolchain:` entry names; None for the installed one. `spec` is `installed`,
    an onnxruntime-qnn version ("2.3.0"), or {qairt: "2.47"} / {onnxruntime-qnn: "2.3.0"} (the devices' runtime:
    the newest release whose QAIRT is not newer). A release equal to the installed plugin is the installed
    toolchain: it costs nothing extra. UsageError (exit 2, `where` first) for what no release serves."""
    if spec == INSTALLED:
        return None
    if isinstance(spec, str):
        spec = {"onnxruntime-qnn": spec}
    want = runtime({k: str(v) for k, v in spec.items()}, where)  # checks names, versions, the oldest QAIRT
    if want.plugin is not None:
        plugin = want.plugin
    else:
        fits = [p for p, q in PUBLISHED.items() if parse_version(q)[:len(want.qairt)] <= want.qairt]  # type: ignore[index]
        plugin = max(fits, key=parse_version)  # runtime() refused a QAIRT older than every release
    # The devices' onnxruntime (if given) needs nothing here: every wrapper is lowered for the oldest.
    return None if plugin == installed_plugin else Toolchain(plugin)
