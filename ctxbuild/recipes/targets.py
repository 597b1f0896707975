"""The built-in SoC table and target resolution (names, aliases, groups, explicit soc_model/htp_arch)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ctxbuild.recipes.suggest import did_you_mean


@dataclass(frozen=True)
class Soc:
    name: str
    soc_model: int
    htp_arch: int
    vtcm_mb: int
    aliases: tuple[str, ...] = ()
    marketing: str = ""


# Sources: onnxruntime-qnn soc_table.h, ExecuTorch qc_schema.py (see shared/QNN-NOTES.md).
# VTCM sizes are the public per-arch figures (v68/v69: 2-4 MB, v73+: 8 MB).
SOCS: tuple[Soc, ...] = (
    Soc("SM8350", 30, 68, 4, ("888",), "Snapdragon 888"),
    Soc("SM8450", 36, 69, 8, ("8Gen1",), "Snapdragon 8 Gen 1"),
    Soc("SC8280X", 37, 68, 8, (), "Snapdragon 8cx Gen 3"),
    Soc("SA8295", 39, 68, 8, (), "SA8295P"),
    Soc("SM8475", 42, 69, 8, ("8+Gen1",), "Snapdragon 8+ Gen 1"),
    Soc("SM8550", 43, 73, 8, ("8Gen2",), "Snapdragon 8 Gen 2"),
    Soc("SA8255", 52, 73, 8, (), "SA8255P"),
    Soc("SM8650", 57, 75, 8, ("8Gen3",), "Snapdragon 8 Gen 3"),
    Soc("SC8380XP", 60, 73, 8, ("X-Elite",), "Snapdragon X Elite"),
    Soc("SM8635", 68, 73, 8, ("8sGen3",), "Snapdragon 8s Gen 3"),
    Soc("SM8750", 69, 79, 8, ("8Elite",), "Snapdragon 8 Elite"),
    Soc("SM7675", 70, 73, 8, (), "Snapdragon 7+ Gen 3"),
    Soc("SA8797", 72, 81, 8, (), "SA8797P"),
    Soc("QCS9100", 77, 73, 8, (), "QCS9100"),
    Soc("SM8850", 87, 81, 8, (), "Snapdragon 8 Elite Gen 5"),
    Soc("SC8480XP", 88, 81, 8, (), "Snapdragon X2 Elite"),
    Soc("QCM6490", 93, 68, 2, (), "QCM6490"),
    Soc("SM8845", 97, 81, 8, (), "SM8845"),
)

_BY_NAME: dict[str, Soc] = {}
for _soc in SOCS:
    for _n in (_soc.name, *_soc.aliases):
        _BY_NAME[_n.upper()] = _soc

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Target:
    """One compile target: a directory name under OUT plus the provider options that select the SoC."""

    name: str
    soc_model: str  # comma-separated for multi-SoC ("flexible") binaries
    htp_arch: str
    vtcm_mb: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "soc_model": self.soc_model, "htp_arch": self.htp_arch}


def lookup(name: str) -> Soc | None:
    return _BY_NAME.get(name.upper())


def by_soc_model(soc_model: str) -> Soc | None:
    """The table's SoC with this soc_model number; None for a number it does not know (or a multi-SoC list)."""
    return next((s for s in SOCS if str(s.soc_model) == soc_model), None)


def suggest(name: str, extra: list[str] | None = None) -> str:
    candidates = [s.name for s in SOCS] + [a for s in SOCS for a in s.aliases] + (extra or [])
    close = did_you_mean(name, candidates, cutoff=0.5)
    if close:
        return f"{close} (`ctxbuild targets` lists them)"
    return "`ctxbuild targets` lists the known SoCs; or give {name, soc_model, htp_arch} explicitly"


def soc_target(soc: Soc) -> Target:
    return Target(soc.name, str(soc.soc_model), str(soc.htp_arch), soc.vtcm_mb)


def is_safe_name(name: str) -> bool:
    """A name usable as one path component under OUT (no separators, no '..')."""
    return bool(_SAFE_NAME.match(name)) and ".." not in name
