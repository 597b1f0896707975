"""Every SoC ctxbuild knows, in one table: adding a SoC is one row here.

A row is a QNN soc_model number (Qnn_SocModel_t) and its name, which is all reading a binary needs (qnn/system
names the soc_model it finds). A row with an htp_arch is also a SoC ctxbuild builds for: recipes/targets.py
resolves recipe targets among those (name, alias, marketing name or device) and `ctxbuild targets` lists them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Soc:
    name: str
    soc_model: int  # Qnn_SocModel_t
    htp_arch: int | None = None  # None: QNN names it, ctxbuild does not build for it
    vtcm_mb: int | None = None
    aliases: tuple[str, ...] = ()
    marketing: str = ""
    devices: tuple[str, ...] = ()  # device names as Qualcomm AI Hub spells them (accepted as targets too)


# soc_model numbers and names: Qnn_SocModel_t (QnnTypes.h, SDK 2.43) plus newer models from onnxruntime-qnn's
# soc_table.h. Arch and VTCM: onnxruntime-qnn soc_table.h, ExecuTorch qc_schema.py (see shared/QNN-NOTES.md);
# VTCM sizes are the public per-arch figures (v68/v69: 2-4 MB, v73+: 8 MB).
# Device names: Qualcomm AI Hub's (`qai-hub list-devices`); which SoC a reference design (QRD/CRD/ADP) has:
# quic/ai-hub-models' HUB_DEVICE_TO_QDC_DEVICE_MAP; the Galaxy S phones: their "for Galaxy" Snapdragon (the
# variants AI Hub hosts; some regions' S21-S24 have an Exynos instead, which no QNN target serves).
_S = "Samsung Galaxy "
TABLE: tuple[Soc, ...] = (
    Soc("SDM845", 1),
    Soc("SDM835", 2),
    Soc("SDM821", 3),
    Soc("SDM820", 4),
    Soc("SDM801", 5),
    Soc("SDM670", 6),
    Soc("SDM660", 7),
    Soc("SDM652", 8),
    Soc("SDM636", 9),
    Soc("SDM630", 10),
    Soc("SDM625", 11),
    Soc("SDM855", 12),
    Soc("SDM710", 13),
    Soc("SDM632", 15),
    Soc("SM6150", 16),
    Soc("SM7150", 17),
    Soc("QCS405", 18),
    Soc("SM6125", 19),
    Soc("QCS403", 20),
    Soc("SDM865", 21),
    Soc("IPQ6018", 23),
    Soc("IPQ6028", 24),
    Soc("SM7250", 25),
    Soc("SA8195", 26),
    Soc("SM6250", 27),
    Soc("SM4250", 28),
    Soc("SM6350", 29),
    Soc("SM8350", 30, 68, 4, ("888",), "Snapdragon 888", (_S + "S21", _S + "S21+", _S + "S21 Ultra")),
    Soc("SM4350", 31),
    Soc("SM7350", 32),
    Soc("QCS410", 33),
    Soc("SM8325", 34),
    Soc("SM7325", 35),
    Soc("SM8450", 36, 69, 8, ("8Gen1",), "Snapdragon 8 Gen 1",
        (_S + "S22 (Family)", _S + "S22 Ultra 5G", _S + "Tab S8", "Xiaomi 12", "Xiaomi 12 Pro")),
    Soc("SC8280X", 37, 68, 8, (), "Snapdragon 8cx Gen 3"),
    Soc("SM7315", 38),
    Soc("SA8295", 39, 68, 8, (), "SA8295P", ("SA8295P ADP",)),
    Soc("SM6225", 40),
    Soc("SM7450", 41),
    Soc("SM8475", 42, 69, 8, ("8+Gen1",), "Snapdragon 8+ Gen 1"),
    Soc("SM8550", 43, 73, 8, ("8Gen2",), "Snapdragon 8 Gen 2", (_S + "S23", _S + "S23+", _S + "S23 Ultra")),
    Soc("SXR1230P", 45),
    Soc("SSG2115P", 46),
    Soc("STP6225P", 47),
    Soc("QCS6125", 48),
    Soc("QRB4210", 49),
    Soc("SM6450", 50),
    Soc("QCS7230", 51),
    Soc("SA8255", 52, 73, 8, (), "SA8255P"),
    Soc("SXR2230P", 53),
    Soc("SM7475", 54),
    Soc("SM4375", 55),
    Soc("QCM4325", 56),
    Soc("SM8650", 57, 75, 8, ("8Gen3",), "Snapdragon 8 Gen 3",
        (_S + "S24", _S + "S24+", _S + "S24 Ultra", "Snapdragon 8 Gen 3 QRD")),
    Soc("SSG2125P", 58),
    Soc("SM4450", 59),
    Soc("SC8380XP", 60, 73, 8, ("X-Elite",), "Snapdragon X Elite", ("Snapdragon X Elite CRD",)),
    Soc("SM7435", 61),
    Soc("SA8540", 62),
    Soc("AIC100", 63),
    Soc("SM7550", 64),
    Soc("SM6450Q", 65),
    Soc("QCS8550", 66),
    Soc("SA8620P", 67),
    Soc("SM8635", 68, 73, 8, ("8sGen3",), "Snapdragon 8s Gen 3"),
    Soc("SM8750", 69, 79, 8, ("8Elite",), "Snapdragon 8 Elite",
        ("Snapdragon 8 Elite QRD", _S + "S25", _S + "S25+", _S + "S25 Ultra")),
    Soc("SM7675", 70, 73, 8, (), "Snapdragon 7+ Gen 3"),
    Soc("SM4635", 71),
    Soc("SA8797", 72, 81, 8, (), "SA8797P"),
    Soc("SM7635", 73),
    Soc("SM6650", 74),
    Soc("SXR2330P", 75),
    Soc("SM6475", 76),
    Soc("QCS9100", 77, 73, 8, (), "QCS9100"),
    Soc("QCM6690", 78),
    Soc("IPQ9574", 79),
    Soc("IPQ5404", 80),
    Soc("IPQ5424", 81),
    Soc("QCS8300", 82),
    Soc("QCS2290", 83),
    Soc("SA525M", 84),
    Soc("SM8735", 85),
    Soc("SM7750", 86),
    Soc("SM8850", 87, 81, 8, (), "Snapdragon 8 Elite Gen 5", ("Snapdragon 8 Elite Gen 5 QRD",)),
    Soc("SC8480XP", 88, 81, 8, (), "Snapdragon X2 Elite", ("Snapdragon X2 Elite CRD",)),
    Soc("QCM6490", 93, 68, 2, (), "QCM6490"),
    Soc("SM8845", 97, 81, 8, (), "SM8845"),
)

_NAMES = {s.soc_model: s.name for s in TABLE}
assert len(_NAMES) == len(TABLE), "a soc_model appears twice in the table"


def name_of(soc_model: int | None) -> str | None:
    """The SoC's name for a soc_model number; None for a number the table does not know."""
    return _NAMES.get(soc_model) if soc_model is not None else None
