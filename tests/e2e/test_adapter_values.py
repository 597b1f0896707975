"""LoRA adapter values and `scale` must be finite (issue 19, item 16): a NaN adapter shipped with
--no-verify, and `scale: .nan` was accepted."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctxbuild.errors import ActionError
from ctxbuild.lora.adapters import bind
from tests.conftest import keep_only

SPEC = {"l.lora_A": ((2, 4), np.dtype(np.float32)), "l.lora_B": ((4, 2), np.dtype(np.float16)),
        "lora_scale": ((1,), np.dtype(np.float32))}


def _adapter(tmp_path: Path, a: np.ndarray, b: np.ndarray) -> Path:
    path = tmp_path / "a.npz"
    np.savez(path, **{"l.lora_A": a, "l.lora_B": b})
    return path


@pytest.mark.parametrize("bad, expect", [
    (np.nan, "1 NaN"),
    (np.inf, "1 infinite"),
])
def test_non_finite_value_is_a_failed_action(tmp_path: Path, bad: float, expect: str) -> None:
    a = np.ones((2, 4), np.float32)
    a[1, 2] = bad
    path = _adapter(tmp_path, a, np.ones((4, 2), np.float32))
    with pytest.raises(ActionError, match=f"tensor 'l.lora_A' holds {expect}"):
        bind(path, SPEC, tensors={}, scaling="lora_scale", scale=None)


def test_value_overflowing_the_slot_dtype(tmp_path: Path) -> None:
    b = np.ones((4, 2), np.float32)
    b[0, 0] = 1e6  # finite in float32, infinite in the slot's float16
    path = _adapter(tmp_path, np.ones((2, 4), np.float32), b)
    with pytest.raises(ActionError, match="beyond the range of float16"):
        bind(path, SPEC, tensors={}, scaling="lora_scale", scale=None)


def test_finite_adapter_binds(tmp_path: Path) -> None:
    path = _adapter(tmp_path, np.ones((2, 4), np.float32), np.ones((4, 2), np.float32))
    out = bind(path, SPEC, tensors={}, scaling="lora_scale", scale=0.5)
    assert out["lora_scale"].tolist() == [0.5]


@pytest.mark.parametrize("scale", [".nan", ".inf", "-.inf"])
def test_non_finite_scale_is_refused_at_plan_time(tree: Path, tmp_path: Path, ctxbuild, scale: str) -> None:
    keep_only(tree, "lora_mlp.yaml")
    recipe = tree / "lora_mlp.yaml"
    recipe.write_text(recipe.read_text().replace("scale: 0.5", f"scale: {scale}"))
    r = ctxbuild("plan", str(tree), "-o", str(tmp_path / "out"))
    assert r.code == 2, r.text
    line = r.err.strip().splitlines()[-1]
    assert "lora_mlp.yaml:20:" in line and "scale" in line and "finite" in line, line


def test_nan_adapter_does_not_ship_without_verification(tree: Path, tmp_path: Path, ctxbuild) -> None:
    """The build that shipped it: `pirate` (not calibrated) with a NaN, --no-verify."""
    keep_only(tree, "lora_mlp.yaml")
    with np.load(tree / "models" / "adapters" / "casual.npz") as z:
        values = {k: z[k].copy() for k in z.files}
    first = sorted(values)[0]
    values[first].flat[0] = np.nan
    np.savez(tree / "models" / "adapters" / "nan.npz", **values)
    recipe = tree / "lora_mlp.yaml"
    recipe.write_text(recipe.read_text().replace(
        "{name: pirate, file: models/adapters/pirate.onnx_adapter, scale: 0.5}",
        "name: pirate\n      file: models/adapters/nan.npz\n      tensors:\n" + "".join(
            f"        {k}: {k.removeprefix('base_model.').removesuffix('.weight')}\n" for k in sorted(values))))
    out = tmp_path / "out"
    r = ctxbuild("build", str(tree), "-o", str(out), "--no-verify", "--target", "SM8650")
    assert r.code == 1, r.text
    assert "Traceback" not in r.text
    assert f"nan.npz: tensor '{first}' holds 1 NaN value" in r.err, r.err
    assert not list(out.glob("SM8650/lora_mlp/*pirate*")), list(out.rglob("*pirate*"))
