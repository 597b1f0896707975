"""Target resolution: the SoCs a recipe can target (qnn/socs.py has the table), looked up by name, alias,
marketing name or device, and the Target a recipe compiles for (a SoC, or explicit soc_model/htp_arch)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ctxbuild.qnn.socs import TABLE, Soc
from ctxbuild.recipes.suggest import did_you_mean

# The SoCs a recipe can target: the table's rows with an arch (qnn/socs.py), in soc_model order.
SOCS: tuple[Soc, ...] = tuple(s for s in TABLE if s.htp_arch is not None)


def _key(name: str) -> str:
    """Case, spaces and hyphens do not matter: 'samsung galaxy s24' is 'Samsung Galaxy S24', '8 gen 2' is '8Gen2'."""
    return "".join(name.upper().replace("-", " ").split())


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
    close = did_you_mean(name, candidates, cutoff=0.5, n=3)
    if close:
        return f"{close} (`ctxbuild targets` lists them)"
    return "`ctxbuild targets` lists the known SoCs; or give {name, soc_model, htp_arch} explicitly"


def soc_target(soc: Soc) -> Target:
    return Target(soc.name, str(soc.soc_model), str(soc.htp_arch), soc.vtcm_mb)


def is_safe_name(name: str) -> bool:
    """A name usable as one path component under OUT (no separators, no '..')."""
    return bool(_SAFE_NAME.match(name)) and ".." not in name
