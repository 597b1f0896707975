"""Device runtimes: a QAIRT version (given, or through the onnxruntime-qnn release that ships it) and onnxruntime.

The published onnxruntime-qnn wheels and the QAIRT each ships, read from the wheels themselves
(`onnxruntime_qnn/build_and_package_info.py`, `qnn_version`; `pip download --no-deps onnxruntime-qnn==X` from
PyPI on 2026-11-23; the same versions are in `libQnnHtp.so`'s build string and the `ep_sdk_version` the EP
stamps). Every one of them requires only `onnxruntime>=1.24.2`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ctxbuild.errors import UsageError

PUBLISHED: dict[str, str] = {  # onnxruntime-qnn -> QAIRT (QNN SDK)
    "2.3.0": "2.47.0",
    "2.4.0": "2.48.40",
    "2.5.0": "2.49.40",
    "2.6.0": "2.50.40",
    "2.7.0": "2.51.0",
}
OLDEST_ONNXRUNTIME = (1, 24)  # the plugin EP's Requires-Dist: onnxruntime>=1.24.2
# Newest ONNX IR each onnxruntime opens. Measured: 1.24.4 refuses 14 ("max supported IR version: 13"), 1.32.0
# writes and opens 14; QNN-NOTES: 1.31 reads at most 13. Versions in between count as 13 (not measured).
_MAX_IR = ((1, 32), 14), ((1, 24), 13)
KEYS = ("qairt", "onnxruntime-qnn", "onnxruntime")

Version = tuple[int, ...]


@dataclass(frozen=True)
class Runtime:
    """What a device carries: its QAIRT, and the onnxruntime that opens the wrappers (None: the oldest the
    plugin EP runs on, 1.24, the conservative choice)."""

    qairt: Version
    onnxruntime: Version | None = None
    plugin: str | None = None  # the onnxruntime-qnn release named, if the runtime was given that way

    @property
    def label(self) -> str:
        s = f"qairt={fmt(self.qairt)}"
        if self.plugin:
            s = f"onnxruntime-qnn={self.plugin} ({s})"
        return s + (f", onnxruntime={fmt(self.onnxruntime)}" if self.onnxruntime else "")

    @property
    def max_ir(self) -> int:
        ort = self.onnxruntime or OLDEST_ONNXRUNTIME
        return next(ir for since, ir in _MAX_IR if ort[:2] >= since)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"label": self.label, "qairt": fmt(self.qairt), "max_ir_version": self.max_ir}
        if self.plugin:
            d["onnxruntime-qnn"] = self.plugin
        if self.onnxruntime:
            d["onnxruntime"] = fmt(self.onnxruntime)
        return d


def fmt(v: Version) -> str:
    return ".".join(map(str, v))


def parse_version(text: str) -> Version | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)?", text.strip())
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def oldest_qairt() -> Version:
    return min(parse_version(q) for q in PUBLISHED.values())  # type: ignore[type-var]


def runtime(spec: dict[str, str], where: str) -> Runtime:
    """A runtime from {qairt: "2.47"} / {onnxruntime-qnn: "2.3.0"} (+ optional onnxruntime). `where` starts the
    error line (a recipe's file:line, or the CLI option). UsageError (exit 2) for what no toolchain serves."""
    unknown = sorted(set(spec) - set(KEYS))
    if unknown or not ({"qairt", "onnxruntime-qnn"} & set(spec)):
        raise UsageError(f"{where}: a runtime names `qairt` or `onnxruntime-qnn` (and optionally `onnxruntime`)"
                         + (f", not {', '.join(unknown)}" if unknown else ""),
                         'e.g. qairt=2.47, or onnxruntime-qnn=2.3.0,onnxruntime=1.24.4')
    plugin = spec.get("onnxruntime-qnn")
    if plugin is not None and plugin not in PUBLISHED:
        raise UsageError(f"{where}: onnxruntime-qnn {plugin} is not a published release",
                         f"known: {', '.join(PUBLISHED)}; or give the device's QAIRT as qairt=2.NN")
    qairt_text = spec.get("qairt") or PUBLISHED[plugin]  # type: ignore[index]
    qairt = parse_version(qairt_text)
    if qairt is None:
        raise UsageError(f"{where}: QAIRT version {qairt_text!r} is not MAJOR.MINOR[.PATCH]", "e.g. qairt=2.47")
    if plugin is not None and "qairt" in spec and qairt[:2] != parse_version(PUBLISHED[plugin])[:2]:  # type: ignore[index]
        raise UsageError(f"{where}: onnxruntime-qnn {plugin} ships QAIRT {PUBLISHED[plugin]}, not {qairt_text}",
                         "give one of the two")
    if qairt[:2] < oldest_qairt()[:2]:
        raise UsageError(f"{where}: QAIRT {qairt_text} is older than the oldest onnxruntime-qnn release "
                         f"(2.3.0, QAIRT {fmt(oldest_qairt())}): no toolchain ctxbuild can use builds for it",
                         "build with the QAIRT SDK's own tools for that runtime, or update the devices")
    ort = None
    if "onnxruntime" in spec:
        ort = parse_version(spec["onnxruntime"])
        if ort is None or ort[:2] < OLDEST_ONNXRUNTIME:
            raise UsageError(f"{where}: onnxruntime {spec['onnxruntime']!r}: the QNN plugin EP needs 1.24.2 or newer",
                             "e.g. onnxruntime=1.24.4")
    return Runtime(qairt, ort, plugin)


def parse_cli(text: str) -> Runtime:
    """`--runtime qairt=2.47[,onnxruntime=1.24.4]` or `--runtime onnxruntime-qnn=2.3.0`."""
    pairs = [p.partition("=") for p in text.split(",") if p.strip()]
    if not pairs or any(not sep or not v.strip() for _, sep, v in pairs):
        raise UsageError(f"--runtime {text!r}: expected KEY=VERSION[,KEY=VERSION]", "e.g. --runtime qairt=2.47")
    keys = [k.strip() for k, _, _ in pairs]
    if twice := sorted({k for k in keys if keys.count(k) > 1}):
        raise UsageError(f"--runtime {text!r}: {', '.join(twice)} given twice in one runtime",
                         "one runtime per --runtime; repeat the option for several: --runtime qairt=2.47 "
                         "--runtime qairt=2.51")
    return runtime({k.strip(): v.strip() for k, _, v in pairs}, f"--runtime {text}")
