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
    devices: tuple[str, ...] = ()  # device names as Qualcomm AI Hub spells them (accepted as targets too)


# Sources: onnxruntime-qnn soc_table.h, ExecuTorch qc_schema.py (see shared/QNN-NOTES.md).
# VTCM sizes are the public per-arch figures (v68/v69: 2-4 MB, v73+: 8 MB).
# Device names: Qualcomm AI Hub's (`qai-hub list-devices`); which SoC a reference design (QRD/CRD/ADP) has:
# quic/ai-hub-models' HUB_DEVICE_TO_QDC_DEVICE_MAP; the Galaxy S phones: their "for Galaxy" Snapdragon (the
# variants AI Hub hosts; some regions' S21-S24 have an Exynos instead, which no QNN target serves).
_S = "Samsung Galaxy "
SOCS: tuple[Soc, ...] = (
    Soc("SM8350", 30, 68, 4, ("888",), "Snapdragon 888", (_S + "S21", _S + "S21+", _S + "S21 Ultra")),
    Soc("SM8450", 36, 69, 8, ("8Gen1",), "Snapdragon 8 Gen 1",
        (_S + "S22 (Family)", _S + "S22 Ultra 5G", _S + "Tab S8", "Xiaomi 12", "Xiaomi 12 Pro")),
    Soc("SC8280X", 37, 68, 8, (), "Snapdragon 8cx Gen 3"),
    Soc("SA8295", 39, 68, 8, (), "SA8295P", ("SA8295P ADP",)),
    Soc("SM8475", 42, 69, 8, ("8+Gen1",), "Snapdragon 8+ Gen 1"),
    Soc("SM8550", 43, 73, 8, ("8Gen2",), "Snapdragon 8 Gen 2", (_S + "S23", _S + "S23+", _S + "S23 Ultra")),
    Soc("SA8255", 52, 73, 8, (), "SA8255P"),
    Soc("SM8650", 57, 75, 8, ("8Gen3",), "Snapdragon 8 Gen 3",
        (_S + "S24", _S + "S24+", _S + "S24 Ultra", "Snapdragon 8 Gen 3 QRD")),
    Soc("SC8380XP", 60, 73, 8, ("X-Elite",), "Snapdragon X Elite", ("Snapdragon X Elite CRD",)),
    Soc("SM8635", 68, 73, 8, ("8sGen3",), "Snapdragon 8s Gen 3"),
    Soc("SM8750", 69, 79, 8, ("8Elite",), "Snapdragon 8 Elite",
        ("Snapdragon 8 Elite QRD", _S + "S25", _S + "S25+", _S + "S25 Ultra")),
    Soc("SM7675", 70, 73, 8, (), "Snapdragon 7+ Gen 3"),
    Soc("SA8797", 72, 81, 8, (), "SA8797P"),
    Soc("QCS9100", 77, 73, 8, (), "QCS9100"),
    Soc("SM8850", 87, 81, 8, (), "Snapdragon 8 Elite Gen 5", ("Snapdragon 8 Elite Gen 5 QRD",)),
    Soc("SC8480XP", 88, 81, 8, (), "Snapdragon X2 Elite", ("Snapdragon X2 Elite CRD",)),
    Soc("QCM6490", 93, 68, 2, (), "QCM6490"),
    Soc("SM8845", 97, 81, 8, (), "SM8845"),
)

def _key(name: str) -> str:
    """Case and spacing do not matter: 'samsung galaxy s24' is 'Samsung Galaxy S24'."""
    return " ".join(name.upper().split())


_BY_NAME: dict[str, Soc] = {}
for _soc in SOCS:
    for _n in (_soc.name, *_soc.aliases, _soc.marketing, *_soc.devices):
        assert _BY_NAME.setdefault(_key(_n), _soc) is _soc, f"{_n} names two SoCs"

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
    """A SoC by its name, alias, marketing name or a device with it ("Samsung Galaxy S24": SM8650)."""
    return _BY_NAME.get(_key(name))


def by_soc_model(soc_model: str) -> Soc | None:
    """The table's SoC with this soc_model number; None for a number it does not know (or a multi-SoC list)."""
    return next((s for s in SOCS if str(s.soc_model) == soc_model), None)


def suggest(name: str, extra: list[str] | None = None) -> str:
    candidates = [s.name for s in SOCS] + [a for s in SOCS for a in (*s.aliases, *s.devices)] + (extra or [])
    close = did_you_mean(name, candidates, cutoff=0.5)
    if close:
        return f"{close} (`ctxbuild targets` lists them)"
    return "`ctxbuild targets` lists the known SoCs; or give {name, soc_model, htp_arch} explicitly"


def soc_target(soc: Soc) -> Target:
    return Target(soc.name, str(soc.soc_model), str(soc.htp_arch), soc.vtcm_mb)


def is_safe_name(name: str) -> bool:
    """A name usable as one path component under OUT (no separators, no '..')."""
    return bool(_SAFE_NAME.match(name)) and ".." not in name
