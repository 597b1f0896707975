"""Recipe `inputs:` against the model's graph inputs, checked when planning (no action runs)."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from ctxbuild.errors import RecipeError
from ctxbuild.graph import signature
from ctxbuild.recipes import recipe


def _tree(tmp_path: Path, inputs: str, dims: list[int | str] = ["N", 3, 32, 48]) -> Path:
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["image"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(f"model: m.onnx\nprecision: fp16\ntargets: [SM8650]\n{inputs}")
    return tmp_path / "r.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXBUILD_CACHE_DIR", str(tmp_path / "cache"))


def _error(path: Path) -> str:
    with pytest.raises(RecipeError) as e:
        recipe.load([path])
    assert e.value.exit_code == 2
    return str(e.value)


def test_transposed_shape_names_the_layouts(tmp_path: Path) -> None:
    f = _tree(tmp_path, "inputs:\n  image: [1, 32, 48, 3]\n")
    assert _error(f) == (f"{f}:5: inputs: 'image' is [1, 32, 48, 3] in the recipe and [N, 3, 32, 48] in m.onnx "
                         "(dims 1, 2, 3 differ) (the recipe's shape is NHWC, the model's input is NCHW: "
                         "write [1, 3, 32, 48])")
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n", ["N", 32, 48, 3])
    assert "the recipe's shape is NCHW, the model's input is NHWC: write [1, 32, 48, 3]" in _error(f)


def test_unknown_name_and_open_dims(tmp_path: Path) -> None:
    f = _tree(tmp_path, "inputs:\n  imgae: [1, 3, 32, 48]\n")
    assert _error(f) == f"{f}:5: inputs: 'imgae' is not an input of m.onnx (did you mean 'image'?)"
    f = _tree(tmp_path, "")
    assert _error(f) == (f"{f}:1: input 'image' of m.onnx has dynamic dims [N, 3, 32, 48]; QNN needs fixed shapes "
                         "(add inputs: {image: [1, 3, 32, 48]} (1 where the model leaves a dim open: use your real size))")
    f = _tree(tmp_path, "inputs:\n  image: [4, 3, 32, 48]\n")
    assert recipe.load([f]).recipes[0].graphs[0].inputs == {"image": (4, 3, 32, 48)}
    # a typo'd size (two zeros too many): QNN compiled a 110 GB input for minutes; refused when planning
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 48000, 192000]\n", ["N", 3, "h", "w"])
    assert _error(f) == (f"{f}:5: inputs: 'image' [1, 3, 48000, 192000] holds 27,648,000,000 elements per sample, "
                         "103 GiB as float32: beyond what the HTP (a 32-bit DSP) addresses (give the shape the app "
                         "feeds the model (a typo?))")


def test_open_dims_take_the_samples_shape_and_nhwc_samples_say_so(tmp_path: Path) -> None:
    """A newcomer leaves the dynamic dims open, samples in calibration.dir: the hint gave 1 for every open dim
    (`[1, 3, 1, 1]`, pasted it builds a 1x1 model the samples then fail); it gives the samples' shape. Samples saved
    channels last said only "regenerate the samples": it names the layout and the transpose."""
    import numpy as np

    from ctxbuild.errors import ActionError
    from ctxbuild.graph.samples import check_sample

    f = _tree(tmp_path, "calibration: {dir: cal}\n", ["N", 3, "h", "w"])
    (tmp_path / "cal").mkdir()
    np.save(tmp_path / "cal" / "a.npy", np.zeros((2, 3, 32, 48), np.float32))
    assert _error(f).endswith("(add inputs: {image: [2, 3, 32, 48]} (the shape of your sample a.npy))")
    np.savez(tmp_path / "cal" / "0.npz", image=np.zeros((1, 3, 8, 8), np.float32))
    assert _error(f).endswith("(add inputs: {image: [1, 3, 8, 8]} (the shape of your sample 0.npz))")
    np.savez(tmp_path / "cal" / "0.npz", image=np.zeros((1, 8, 8, 3), np.float32))  # does not fit: the 1s as before
    assert _error(f).endswith("(add inputs: {image: [1, 3, 1, 1]} (1 where the model leaves a dim open: use your real "
                              "size))")
    with pytest.raises(ActionError) as e:
        check_sample({"image": np.zeros((1, 32, 48, 3), np.float32)}, {"image": ((1, 3, 32, 48), np.float32)},
                     tmp_path / "s.npz", "r", {})
    assert e.value.hint == "the sample is NHWC, the model takes NCHW: save numpy.transpose(array, (0, 3, 1, 2)) instead"
    for shape, hint in (((32, 48, 3), "the sample is HWC without the batch dim, the model takes NCHW: save "
                                      "numpy.transpose(array, (2, 0, 1))[None] instead"),
                        ((3, 32, 48), "the sample lacks the batch dim of 1: save array[None] instead")):
        with pytest.raises(ActionError) as e:  # an image as decoded (cv2.imread: HWC), or without its batch dim
            check_sample({"image": np.zeros(shape, np.float32)}, {"image": ((1, 3, 32, 48), np.float32)},
                         tmp_path / "s.npz", "r", {})
        assert e.value.hint == hint, e.value.hint


def test_graph_inputs_are_memoized_by_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n")
    recipe.load([f])
    reads: list[Path] = []
    real = signature._read
    monkeypatch.setattr(signature, "_read", lambda p: reads.append(p) or real(p))
    recipe.load([f])
    assert reads == []  # a re-plan does not parse the model again
    _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n", ["N", 3, 32, 64])  # the model changed
    assert "dim 3 differs" in _error(f) and reads == [tmp_path / "m.onnx"]


def test_device_names_are_target_aliases(tmp_path: Path) -> None:
    """AI Hub's device names (and marketing names) select the SoC; outputs go under the SoC's name."""
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n")
    f.write_text(f.read_text().replace("targets: [SM8650]", "targets: [Samsung Galaxy S24, snapdragon 8 elite  QRD, "
                                                            "Snapdragon X Elite CRD, Snapdragon 8 Gen 2]"))
    [r] = recipe.load([f]).recipes
    assert [(t.name, t.soc_model, t.htp_arch) for t in r.targets] == [
        ("SM8650", "57", "75"), ("SM8750", "69", "79"), ("SC8380XP", "60", "73"), ("SM8550", "43", "73")]
    f.write_text(f.read_text().replace("Snapdragon 8 Gen 2]", "8 gen 2, x-elite, sm 8650]"))  # aliases spaced
    assert [t.name for t in recipe.load([f]).recipes[0].targets] == ["SM8650", "SM8750", "SC8380XP", "SM8550"]
    f.write_text(f.read_text().replace("Samsung Galaxy S24,", "Samsung Galaxy S42,"))
    assert "unknown SoC or target group 'Samsung Galaxy S42'" in _error(f)
    assert "did you mean 'Samsung Galaxy S2" in _error(f)


def test_a_mistyped_soc_gets_up_to_three_close_names(tmp_path: Path) -> None:
    """`SM8570` offered only SM8850 (issue 48); SM8750 (two digits swapped) and SM8550 (one changed) are closer."""
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n")
    f.write_text(f.read_text().replace("targets: [SM8650]", "targets: [SM8570]"))
    assert "did you mean 'SM8750', 'SM8550' or 'SM8850'? (`ctxbuild targets` lists them)" in _error(f)
    f.write_text(f.read_text().replace("targets: [SM8570]", "targets: [X-Elit]"))
    assert "did you mean 'X-Elite' or '8Elite'?" in _error(f)


def test_a_sample_dir_of_images_and_misnamed_arrays_say_what_to_save(tmp_path: Path) -> None:
    """A newcomer's samples: the image files themselves ("has no .npz/.npy files", nothing about what to save), an
    .npz whose array is named otherwise than the input ("name the arrays after the inputs")."""
    import numpy as np

    from ctxbuild.errors import ActionError
    from ctxbuild.graph.samples import check_sample, list_samples

    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    with pytest.raises(ActionError) as e:
        list_samples(tmp_path, 8, "r.yaml")
    assert str(e.value) == (f"r.yaml: sample dir {tmp_path} has no .npz/.npy files (it holds .png files) (add "
                            "samples, one .npz per sample keyed by input name (or a .npy for a single-input model): "
                            "the arrays as the app feeds them to the model, e.g. an image decoded, resized and "
                            "normalized, not the image file)"), str(e.value)
    with pytest.raises(ActionError) as e:
        check_sample({"image": np.zeros((1, 3), np.float32)}, {"x": ((1, 3), np.float32)}, tmp_path / "s.npz", "r", {})
    assert e.value.hint == "name the arrays after the inputs, numpy.savez(file, x=...) (recipe r)", e.value.hint


def test_samples_of_another_dtype_are_warned_about(tmp_path: Path) -> None:
    """Images saved as decoded (uint8, 0-255) for a float model were cast silently: the model was calibrated and
    verified on a range the app may never feed it. Any other cast is said too, naming the input (issue 48: float32
    for a bool input, int32 for int64), from the samples' headers."""
    import numpy as np

    from ctxbuild.graph.samples import cast_warnings

    spec = {"images": ((1, 3, 4, 4), np.dtype(np.float32))}
    np.save(tmp_path / "s0.npy", np.zeros((1, 3, 4, 4), np.uint8))
    files = [tmp_path / "s0.npy"]
    assert cast_warnings("quantize d (w8a16)", files, spec) == [
        "quantize d (w8a16): sample s0.npy holds images as uint8, the model takes float32: used as stored (e.g. "
        "0-255); if the app normalizes its inputs, save the samples normalized"]
    np.save(tmp_path / "s0.npy", np.zeros((1, 3, 4, 4), np.float64))
    assert cast_warnings("q", files, spec) == [
        "q: sample s0.npy holds images as float64, the model takes float32: cast to float32 (rounded); save the "
        "samples as float32"]
    np.save(tmp_path / "s0.npy", np.zeros((1, 3, 4, 4), np.float32))
    assert cast_warnings("q", files, spec) == []
    (tmp_path / "s0.npy").unlink()
    np.savez(tmp_path / "s0.npz", images=np.zeros((1, 3, 4, 4), np.float32), mask=np.zeros(3, np.float32),
             ids=np.zeros(3, np.int32))
    spec |= {"mask": ((3,), np.dtype(np.bool_)), "ids": ((3,), np.dtype(np.int64))}
    assert [w.split(": ", 1)[1] for w in cast_warnings("q", [tmp_path / "s0.npz"], spec)] == [
        "sample s0.npz holds mask as float32, the model takes bool: cast to bool (every value kept); save the "
        "samples as bool",
        "sample s0.npz holds ids as int32, the model takes int64: cast to int64 (every value kept); save the samples "
        "as int64"]


def test_a_sample_cast_that_changes_values_is_an_error() -> None:
    """Cast silently before: 0.5 for a bool input became True, an int64 beyond int32's range wrapped around."""
    import numpy as np

    from ctxbuild.errors import SampleError
    from ctxbuild.graph.samples import check_sample

    spec = {"mask": ((1, 3), np.dtype(np.bool_)), "ids": ((1, 3), np.dtype(np.int32))}
    ok = check_sample({"mask": np.array([[1.0, 0, 1]], np.float32), "ids": np.array([[1, 2, 3]], np.int64)}, spec,
                      Path("s.npz"), "r", {})
    assert ok["mask"].dtype == np.bool_ and ok["mask"].tolist() == [[True, False, True]] and ok["ids"].dtype == np.int32
    with pytest.raises(SampleError) as e:
        check_sample({"mask": np.array([[0.5, 0, 1]], np.float32), "ids": np.array([[1, 2, 3]], np.int64)}, spec,
                     Path("s.npz"), "r", {})
    assert e.value.exit_code == 2 and str(e.value) == (
        "s.npz: 'mask' is float32, the model takes bool, and the cast changes values (0.5 becomes True, 1 of 3) "
        "(save the sample's 'mask' as bool, with the values the app feeds)")
    with pytest.raises(SampleError, match=r"'ids' is int64, the model takes int32, and the cast changes values "
                                          r"\(4294967296 becomes 0, 1 of 3\)"):
        check_sample({"mask": np.ones((1, 3), np.bool_), "ids": np.array([[2**32, 2, 3]], np.int64)}, spec,
                     Path("s.npz"), "r", {})


def test_a_default_target_the_table_lacks_names_the_defaults_file(tmp_path: Path) -> None:
    """`targets: [phones]` in _defaults.yaml, its group spelled `phone`: the error named the recipe's line 1, which
    holds no targets."""
    f = _tree(tmp_path, "inputs:\n  image: [1, 3, 32, 48]\n")
    f.write_text(f.read_text().replace("targets: [SM8650]\n", ""))
    (tmp_path / "_defaults.yaml").write_text("defaults:\n  targets: [phones]\ntarget_groups:\n  phone: [SM8650]\n")
    assert _error(tmp_path) == (f"{f}:1 (targets from the directory defaults, _defaults.yaml): unknown SoC or target "
                                "group 'phones' (did you mean 'phone'? (`ctxbuild targets` lists them))")
