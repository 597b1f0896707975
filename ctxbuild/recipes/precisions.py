"""Every precision ctxbuild knows, in one table: its name, the other names it answers to, what it quantizes to, where
it runs, and the figures the planner needs. Recipes, the precision search, the summary, the pins it prints and the
errors all speak these names: `w<weight bits>a<activation bits>` as Qualcomm AI Hub and the QAIRT tools write
them. Adding a precision is one row here (docs/internals.md, "Adding a precision").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    means: str  # one line for errors and --help
    aliases: tuple[str, ...] = ()  # other spellings a recipe may use (older ctxbuild names, the a<..>w<..> order)
    # A model/bundle recipe's quantizer settings (onnxruntime get_qnn_qdq_config types); None: ctxbuild does not
    # quantize it (fp16 compiles the float model, qdq an already-quantized one, auto searches)
    activations: str | None = None
    weights: str | None = None
    llm_weights: str | None = None  # an llm: recipe's weights: onnxruntime QuantType, per-channel symmetric
    graph: bool = True  # a model or bundle recipe takes it
    llm: bool = False  # an llm: block takes it
    min_arch: int | None = None  # the oldest HTP arch it compiles and runs on (measured), None: every one
    # verify's default min_cosine / min_snr_db (plan/steps.py), from runs of the examples on the simulator
    thresholds: tuple[float, float] | None = None
    # context binary bytes per byte of model (.onnx + external data; the embed size check), measured with
    # onnxruntime-qnn 2.7.0: fp16 halves float32 weights, 8-bit weights quarter them, qdq keeps its 8-bit weights
    binary_per_model_byte: float | None = None
    llm_weight_bytes: float | None = None  # bytes per weight element in a compiled llm part (part sizing)


# int16 weights compile on v73 and newer and fail on v68/v69 (Conv); int4 weights are measured on v73 and newer
# (bench/quant_support.py, onnxruntime-qnn 2.7.0 / QNN 2.51).
INT16_WEIGHTS_MIN_ARCH = 73
INT4_MIN_ARCH = 73

TABLE: tuple[Precision, ...] = (
    Precision("w8a16", "uint16 activations, 8-bit weights", ("int16", "a16w8"), activations="uint16",
              weights="uint8", llm_weights="QInt8", llm=True, thresholds=(0.99, 20.0), binary_per_model_byte=0.25,
              llm_weight_bytes=1.0),
    Precision("w8a8", "uint8 activations and weights", ("int8", "a8w8"), activations="uint8", weights="uint8",
              thresholds=(0.95, 12.0), binary_per_model_byte=0.25),
    Precision("w16a16", "uint16 activations, int16 weights, HTP v73 or newer", ("a16w16",), activations="uint16",
              weights="int16", min_arch=INT16_WEIGHTS_MIN_ARCH, thresholds=(0.99, 20.0), binary_per_model_byte=0.5),
    Precision("w4a16", "uint16 activations, int4 weights, HTP v73 or newer", ("a16w4",),
              llm_weights="QInt4", graph=False, llm=True, min_arch=INT4_MIN_ARCH, llm_weight_bytes=0.5),
    Precision("fp16", "the float model computed in fp16 on the HTP", ("float16",), llm=True,
              thresholds=(0.999, 30.0), binary_per_model_byte=0.5, llm_weight_bytes=2.0),
    Precision("qdq", "a model already quantized (QuantizeLinear/DequantizeLinear): compiled as it is",
              thresholds=(0.99, 20.0), binary_per_model_byte=1.0),
    # its candidates meet w8a16's bar unless the recipe sets its own
    # an llm: block's auto: per part the cheapest weight setting passing the part check on the CPU (docs/llm.md);
    # quantized at int8, then each candidate's weights rewritten (ctxbuild/llm/auto_precision.py)
    Precision("auto", "the first candidate of a quantization ladder that passes verification on the simulator",
              llm_weights="QInt8", llm=True, thresholds=(0.99, 20.0), llm_weight_bytes=1.0),
)
BY_NAME = {p.name: p for p in TABLE}
_SPELLINGS = {**{a: p for p in TABLE for a in p.aliases}, **BY_NAME}
# Names other tools use for what the HTP cannot take as a precision here: the line to write instead.
OTHER_NAMES = dict.fromkeys(("half", "fp32", "float32", "float"),
                            "write precision: fp16 (the HTP computes float models in fp16)")


def get(name: str) -> Precision:
    """The precision a name or alias means (KeyError for neither)."""
    return _SPELLINGS[name.lower() if isinstance(name, str) else name]


def canonical(name: str) -> str:
    """The table's name for a recipe's spelling; an unknown name is returned as given (the schema refuses it)."""
    try:
        return get(name).name
    except (KeyError, TypeError):
        return name


def spellings(*, llm: bool = False) -> list[str]:
    """Every name and alias a model/bundle recipe (or an llm: block) takes: the schema's enum."""
    return [s for p in TABLE if (p.llm if llm else p.graph) for s in (p.name, *p.aliases)]


def names(*, llm: bool = False) -> list[str]:
    return [p.name for p in TABLE if (p.llm if llm else p.graph)]


def quantized(name: str) -> bool:
    """Whether ctxbuild quantizes a model/bundle recipe's model for it (a quantize action, calibration data)."""
    return get(name).activations is not None


def weight_bits(weights: str) -> int:
    return {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "QInt4": 4, "QInt8": 8}[weights]


def name_of(activations: str, weights: str) -> str:
    """The name of a quantizer setting's types (w8a16 for uint16 activations and uint8 weights, ...)."""
    return f"w{weight_bits(weights)}a{weight_bits(activations)}"


def hint(given: object, *, llm: bool = False) -> str | None:
    """For a precision a recipe (or an llm: block) does not take: the line to write instead, in the table's names."""
    from ctxbuild.recipes.suggest import closest, did_you_mean

    low = str(given).lower()
    if low in OTHER_NAMES:
        return OTHER_NAMES[low]
    if low in _SPELLINGS:
        p = get(low)
        if (p.llm if llm else p.graph):  # a case variant (W8A16)
            return f"write precision: {p.name} (precision names are lower case)"
        where = "an llm: recipe's precision (llm.precision, docs/llm.md)" if p.llm else "a model recipe's precision"
        return f"{p.name} ({p.means}) is {where}"
    close = closest(str(given), spellings(llm=llm), n=1, cutoff=0.6)  # an alias may be the closest: offer its name
    return did_you_mean(canonical(close[0]), names(llm=llm)) if close else None
