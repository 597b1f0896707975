"""The QNN EP's compatibility info (`ep_compatibility_info.QNNExecutionProvider` in a wrapper's metadata) and the
rules the EP judges it by, as onnxruntime-qnn's source has them (onnxruntime/onnxruntime-qnn@ea21142,
core/providers/qnn/cache_compatibility/qnn_cache_compatibility_manager.cc):

- V1 (onnxruntime-qnn 2.3.0, 2.4.0): `backend_id:sdk:backend_api:context_blob:htp_arch:is_htp_usr_drv`
- V2 (2.5.0 on): `v2:backend_id:sdk:backend_api:htp_archs:soc_models:vtcm_mbs:is_htp_usr_drv`, the three lists
  comma-separated, one entry per SoC of a multi-SoC binary; vtcm 0 means unset.
Versions are MAJOR.MINOR.PATCH and compare on major.minor. Rules: another backend id is unsupported; off the
HTP user driver, the binary's backend API version must not be newer than the runtime's (on it, the SDK version;
a binary made for the user driver needs it). Then per SoC entry: arch newer than the device's, a v6x binary on a
v7x+ device (V2), or more VTCM than the device has (V2): unsupported; same arch (and, V2, same VTCM): optimal;
else it loads but a recompile is preferred. The best entry wins.

The EP does not enforce this when a session loads a wrapper (measured, 2.3.0): QNN's own load of the binary
does, and refuses a binary from a newer QAIRT with QNN_CONTEXT_ERROR_INVALID_ARGUMENT (5000).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

METADATA_KEY = "ep_compatibility_info.QNNExecutionProvider"
BACKEND_HTP = 6  # QnnCommon.h: QNN_BACKEND_ID_HTP
_V6X_V7X_BREAK = 73  # the EP's kHtpV6xAndV7xBreakageArch
_VTCM_UNSET = 0

Version = tuple[int, int, int]


class Compatibility(Enum):
    """onnxruntime's OrtCompiledModelCompatibility values the QNN EP answers with, best first."""

    OPTIMAL = "EP_SUPPORTED_OPTIMAL"
    PREFER_RECOMPILATION = "EP_SUPPORTED_PREFER_RECOMPILATION"
    UNSUPPORTED = "EP_UNSUPPORTED"


@dataclass(frozen=True)
class CompatInfo:
    format: int  # 1 or 2; 0: not the EP's, made by ctxbuild from a binary's build id (judged like 1)
    backend_id: int
    sdk_version: Version
    backend_api_version: Version
    htp_archs: tuple[int, ...]
    soc_models: tuple[int, ...]  # V2 only
    vtcm_mbs: tuple[int, ...]  # V2 only; 0: unset
    htp_usr_drv: bool
    context_blob_version: Version | None = None  # V1 only (deprecated by the EP)

    def as_dict(self) -> dict[str, object]:
        v = ".".join
        return {"format": self.format, "backend_id": self.backend_id,
                "sdk_version": v(map(str, self.sdk_version)),
                "backend_api_version": v(map(str, self.backend_api_version)),
                "htp_archs": list(self.htp_archs), "soc_models": list(self.soc_models),
                "vtcm_mbs": list(self.vtcm_mbs), "htp_usr_drv": self.htp_usr_drv}


@dataclass(frozen=True)
class Device:
    """The runtime side: what the device's QNN reports. A device known only by its QAIRT has no backend API
    version here: the SDK versions are compared instead (QNN bumps the HTP backend API with each SDK, the EP's
    source says; measured: QAIRT 2.47.0 reports 5.47.0, 2.51.0 reports 5.51.0)."""

    sdk_version: Version
    htp_arch: int
    vtcm_mb: int
    backend_api_version: Version | None = None
    htp_usr_drv: bool = False


def _int(text: str) -> int:
    if not text.isdigit():  # the EP's DeserializeString: digits only, no sign or blanks
        raise ValueError(f"malformed number {text!r}")
    return int(text)


def _version(text: str) -> Version:
    parts = text.split(".")
    if len(parts) != 3:
        raise ValueError(f"malformed version {text!r}")
    return _int(parts[0]), _int(parts[1]), _int(parts[2])


def _ints(text: str) -> tuple[int, ...]:
    return tuple(_int(p) for p in text.split(","))


def parse(info: str) -> CompatInfo:
    """Parse either format; ValueError (the EP's "not applicable") for anything else."""
    f = info.split(":")
    if f[0] == "v2":
        if len(f) != 8:
            raise ValueError(f"V2 compatibility info has 8 fields, {info!r} has {len(f)}")
        archs, socs, vtcms = _ints(f[4]), _ints(f[5]), _ints(f[6])
        if not len(archs) == len(socs) == len(vtcms):
            raise ValueError(f"unequal sizes of htp_archs, soc_models and vtcm_mbs in {info!r}")
        return CompatInfo(2, _int(f[1]), _version(f[2]), _version(f[3]), archs, socs, vtcms, f[7] == "1")
    if f[0].startswith("v"):
        raise ValueError(f"unknown compatibility info version {f[0]!r}")
    if len(f) != 6:
        raise ValueError(f"V1 compatibility info has 6 fields, {info!r} has {len(f)}")
    return CompatInfo(1, _int(f[0]), _version(f[1]), _version(f[2]), (_int(f[4]),), (), (), f[5] == "1",
                      _version(f[3]))


def judge(info: CompatInfo, device: Device) -> tuple[Compatibility, str]:
    """The EP's verdict for `info` on `device`, and why (one phrase)."""
    if info.backend_id != BACKEND_HTP:
        return Compatibility.UNSUPPORTED, f"backend id {info.backend_id} is not the HTP ({BACKEND_HTP})"
    if info.htp_usr_drv and not device.htp_usr_drv:
        return Compatibility.UNSUPPORTED, "built for the HTP user driver, the device does not use it"
    if device.htp_usr_drv or device.backend_api_version is None:
        ours, theirs, what = info.sdk_version, device.sdk_version, "QAIRT"
    else:
        ours, theirs, what = info.backend_api_version, device.backend_api_version, "HTP backend API"
    if ours[:2] > theirs[:2]:
        return Compatibility.UNSUPPORTED, (
            f"compiled by QAIRT {_short(info.sdk_version)}, newer than the runtime's {what} {_short(theirs)}: "
            "binaries load only on a runtime at least as new")
    best: tuple[Compatibility, str] | None = None
    for i, arch in enumerate(info.htp_archs):
        vtcm = info.vtcm_mbs[i] if info.vtcm_mbs else _VTCM_UNSET
        verdict = _arch(info.format, arch, vtcm, device)
        if best is None or _RANK[verdict[0]] < _RANK[best[0]]:
            best = verdict
    assert best is not None  # parse() guarantees one arch at least
    return best


_RANK = {c: i for i, c in enumerate(Compatibility)}


def _arch(fmt: int, arch: int, vtcm: int, device: Device) -> tuple[Compatibility, str]:
    if arch > device.htp_arch:
        return Compatibility.UNSUPPORTED, f"built for HTP v{arch}, the SoC has v{device.htp_arch}"
    if fmt == 2 and arch < _V6X_V7X_BREAK <= device.htp_arch:
        return Compatibility.UNSUPPORTED, f"built for HTP v{arch}: v6x binaries do not run on v7x+ (v{device.htp_arch})"
    if fmt == 2 and vtcm > device.vtcm_mb:
        return Compatibility.UNSUPPORTED, f"built for {vtcm} MB of VTCM, the SoC has {device.vtcm_mb} MB"
    if arch == device.htp_arch and (fmt != 2 or vtcm == device.vtcm_mb):
        return Compatibility.OPTIMAL, f"built for this SoC (HTP v{arch})"
    if arch < device.htp_arch:
        return Compatibility.PREFER_RECOMPILATION, f"built for HTP v{arch}; a build for v{device.htp_arch} runs better"
    return Compatibility.PREFER_RECOMPILATION, (
        f"built for {vtcm or 'unset'} MB of VTCM, the SoC has {device.vtcm_mb} MB: the EP prefers a recompile")


def _short(v: Version) -> str:
    return f"{v[0]}.{v[1]}"
