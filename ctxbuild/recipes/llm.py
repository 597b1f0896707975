"""The `llm:` block of a recipe: which decoder, which static graphs, how many parts, which precision, which
prompts; checked at load time with file:line errors (exit 2)."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxbuild.errors import RecipeError
from ctxbuild.recipes import precisions
from ctxbuild.recipes.adapters import Adapters, parse_adapters
from ctxbuild.recipes.alpha import AlphaSwitch, parse_alpha
from ctxbuild.llm.prompts import DEFAULT_TEXT, HINT as PROMPTS_HINT, BadPrompt, check as check_prompts, has_text
from ctxbuild.recipes.paths import named_path, outside
from ctxbuild.recipes.targets import Target
from ctxbuild.recipes.yamlsrc import LineDict, line_of

GENAI_TOKENS = 32  # the runtime check's tokens per prompt unless llm.generate says (actions/llm_genai.py)
# A KV output's cosine floor in the part checks (docs/llm-reference.md, "KV outputs"): the trained glasslm at w4a16 passed its
# tokens with int4 layers' KV down to 0.835 on the simulator; SmolLM2-135M at w8a16, whose decode diverges at the first
# generated token, moved later layers' KV to 0.15-0.69. min_cosine (0.95) would fail the first.
MIN_KV_COSINE = 0.8


@dataclass(frozen=True)
class Quality:
    """llm.eval and the gates (ctxbuild/llm/quality.py, docs/llm-reference.md "Quality")."""
    text: Path  # the evaluation text (ctxbuild's own unless llm.eval.text)
    text_given: bool
    tokenizer: Path | None  # the export's tokenizer.json; without one the prompts' ids are the text
    segments: int  # at most this many segments on the CPU
    tokens: int  # greedy tokens per prompt
    simulator: dict[str, int]  # windows, prompts, tokens: what the recipe gives of llm.eval.simulator (llm_quality adds
    # the defaults, which depend on the parts' size)
    max_ppl_ratio: float
    min_agreement: float


# The quality gates' defaults: what a shipped phone model should keep (docs/llm-reference.md, Quality): the issue's figure for
# the best w4a16 setting, which devices ship, so a w4a16 build that keeps the model passes and `precision: auto` can
# choose it; w8a16 is expected to do much better (1.03x / 0.95), which a recipe asks for by setting them.
MAX_PPL_RATIO = 1.15
MIN_AGREEMENT = 0.8
EVAL_TOKENS = 64
PPL_TOKENS = 1024  # unless llm.eval.segments: the segments (one largest CL each) covering this many of the text's tokens
# what the simulator runs (SmolLM2-135M, 2 parts: 34-51 s a call of AR 64, 8-9 s one of AR 1 on a loaded 2-core machine):
# one prefill window of the text, one prompt's window and its first 8 token steps through every part
SIMULATOR_SUBSET = {"windows": 1, "prompts": 1, "tokens": 8}
# ... and where a part holds more than llm_part_eval.SUBSET_ABOVE of QDQ weights, the text's window only: at the 1B shape
# one call of a 4-layer part took 90-147 s at AR 128 and 24-48 s at AR 1, so the default above would take ~30 minutes
# (4 parts x (2 windows + 7 steps)) where this takes ~8; the CPU still measures all of the text and every prompt
SIMULATOR_SUBSET_LARGE = {"windows": 1, "prompts": 0, "tokens": 8}


@dataclass(frozen=True)
class LlmSpec:
    model: Path
    sequence_lengths: tuple[int, ...]  # AR
    context_lengths: tuple[int, ...]  # CL
    parts: int
    precision: str  # w4a16 | w8a16 | fp16 | auto
    kv_cache: str  # uint16 | uint8
    keep_8bit: tuple[str, ...]  # w4a16: weights (fnmatch patterns over initializer names) kept at int8
    prompts: Path
    calibration_prompts: int
    verify_prompts: int
    generate: int
    genai_tokens: int  # tokens the shipped genai_config.json's check compares per prompt (llm.generate if set)
    min_token_agreement: float
    min_cosine: float
    min_kv_cosine: float  # part checks: the floor of each KV output (present.*), MIN_KV_COSINE unless given
    simulator: str  # what the part checks run on the simulator: auto, all, covering (llm_part_eval.on_simulator)
    quality: Quality | None = None  # llm.eval and its gates (every build has one: parse_llm fills the defaults)
    adapters: Adapters | None = None  # LoRA (llm.adapters): slots kept as inputs of every graph reading them
    slot_parts: tuple[int, ...] = ()  # llm.adapters: the parts (0-based) whose graphs read slots
    alpha: AlphaSwitch | None = None  # llm.adapters with switch: alpha (plan/llm.py binds it as the slot lora_alpha)
    tokenizer: tuple[Path, ...] = ()  # files copied beside genai_config.json
    prompt_tokenizer: Path | None = None  # the tokenizer.json text prompts are tokenized with
    quantization: dict[str, Any] | None = None  # llm.quantization with its defaults (int4, block_size, ...); None: fp16


def parse_llm(f: Path, data: LineDict, spec: dict[str, Any], targets: list[Target]) -> LlmSpec:
    from ctxbuild.llm.convention import decoder_facts

    def at(*path: str | int) -> str:
        return f"{f}:{line_of(data, ['llm', *path])}"

    model = named_path(f.parent, spec["model"])
    if not model.is_file():
        raise RecipeError(f"{at('model')}: llm.model '{spec['model']}' not found (looked in {model})",
                          "the decoder's ONNX file, relative to the recipe")
    facts = decoder_facts(model) or {}  # a file that is not ONNX at all: llm_split says so
    if "error" in facts:
        raise RecipeError(f"{at('model')}: {model.name}: {facts['error']}")
    layers = facts.get("layers")
    ars = tuple(spec.get("sequence_lengths", [128, 1]))
    cls = tuple(spec["context_lengths"])
    for cl in cls:
        if cl <= max(ars):
            raise RecipeError(f"{at('context_lengths')}: context length {cl} is not larger than sequence length "
                              f"{max(ars)}", "every CL must exceed every AR (the cache holds CL - AR past positions)")
    precision = precisions.canonical(spec.get("precision", "w4a16"))  # an alias (a16w4 ...) is its table name
    parts = spec.get("parts", 1)
    if "part_max_mb" in spec and "parts" in spec:
        raise RecipeError(f"{at('part_max_mb')}: give parts or part_max_mb, not both", "part_max_mb chooses parts")
    if "part_max_mb" in spec:
        parts = _parts_for_budget(at("part_max_mb"), model.name, facts, precision, spec["part_max_mb"],
                                  spec.get("keep_8bit"))
    if layers is not None and parts > layers:
        raise RecipeError(f"{at('parts')}: {parts} parts for a model of {layers} layers",
                          f"use at most {layers} (one layer per part)")
    if least := precisions.get("w4a16" if precision == "auto" else precision).min_arch:  # auto may choose int4
        old = [t.name for t in targets if all(int(a) < least for a in t.htp_arch.split(","))]
        if old:
            raise RecipeError(f"{at('precision')}: {precision} on {', '.join(old)} (htp_arch below v{least}): its "
                              f"weights are measured only on v{least} and newer",
                              "use precision: w8a16 for these targets")
    if "kv_cache" in spec and precision == "fp16":
        raise RecipeError(f"{at('kv_cache')}: kv_cache sets a quantized type; precision fp16 keeps the cache in fp16",
                          "remove kv_cache, or use w4a16/w8a16")
    names = facts.get("weights", [])
    quantization = _quantization(at, spec, precision, facts)
    # Default (measured on a trained decoder, docs/llm-reference.md): the first and last blocks' weights at int8, unless
    # the sensitivity ranking chooses (llm.quantization.keep_8bit_share)
    edges = sorted({"model.layers.0.*", f"model.layers.{(layers or 1) - 1}.*"})
    ranked = bool(quantization and quantization["keep_8bit_share"])
    keep_8bit = tuple(spec["keep_8bit"]) if "keep_8bit" in spec else tuple(
        p for p in edges if precision == "w4a16" and not ranked and fnmatch.filter(names, p))
    if "keep_8bit" in spec and precision not in ("w4a16", "auto"):
        raise RecipeError(f"{at('keep_8bit')}: keep_8bit keeps weights of a w4a16 model at int8; precision is {precision}",
                          "remove keep_8bit, or use precision: w4a16")
    for i, pattern in enumerate(keep_8bit):
        if names and not fnmatch.filter(names, pattern):
            raise RecipeError(f"{at('keep_8bit', i)}: '{pattern}' matches no weight of {model.name}",
                              f"an fnmatch pattern over initializer names, e.g. {names[len(names) // 2]!r}")
    prompts = named_path(f.parent, spec["prompts"]["dir"])
    if outside(prompts, f.parent, model.parent):
        raise RecipeError(f"{at('prompts', 'dir')}: llm.prompts.dir '{spec['prompts']['dir']}' is outside the recipe's "
                          f"directory ({f.parent}) and the model's ({model.parent})", COPIED_HINT)
    if not prompts.is_dir():  # its files are found at run time, like calibration samples
        raise RecipeError(f"{at('prompts', 'dir')}: llm.prompts.dir '{spec['prompts']['dir']}' is not a directory "
                          f"(looked in {prompts})", "a directory of token-id .npy files, relative to the recipe")
    tokenizer = _tokenizer_files(f, model.parent, spec.get("tokenizer", []), at)
    prompt_tokenizer = None
    if has_text(prompts):  # the export's own tokenizer: listed for the runtime, else beside the model
        prompt_tokenizer = next((p for p in tokenizer if p.name == "tokenizer.json"), None) or (
            model.parent / "tokenizer.json" if (model.parent / "tokenizer.json").is_file() else None)
        if prompt_tokenizer is None:
            raise RecipeError(f"{at('prompts', 'dir')}: llm.prompts.dir holds text prompts and there is no "
                              "tokenizer.json to tokenize them with",
                              "list the export's tokenizer.json under llm.tokenizer, or keep it beside the model")
    samples, verify = spec["prompts"].get("samples", 4), spec["prompts"].get("verify", 2)
    try:  # read as the llm actions will read them, at plan time (llm/prompts.py)
        check_prompts(prompts, max(samples, verify), prompt_tokenizer, facts.get("vocab"))
    except BadPrompt as e:
        raise RecipeError(f"{at('prompts', 'dir')}: {e}", PROMPTS_HINT) from None
    quality = _quality(f, spec, model, tokenizer, max(cls), at)
    adapters, slot_parts, alpha = None, (), None
    if "adapters" in spec and spec["adapters"].get("switch") == "alpha":
        alpha, wheres = _alpha(f, data, spec, precision, facts)
        slot_parts = _parts_reading(wheres, layers, parts)
    elif "adapters" in spec:
        adapters, wheres = _adapters(f, data, spec, precision, facts, model.name)
        slot_parts = _parts_reading(wheres, layers, parts)
    return LlmSpec(model=model, sequence_lengths=ars, context_lengths=cls, parts=parts, precision=precision,
                   kv_cache=spec.get("kv_cache", "uint16"), keep_8bit=keep_8bit, prompts=prompts,
                   calibration_prompts=samples, verify_prompts=verify,
                   generate=spec.get("generate", 8), genai_tokens=spec.get("generate", GENAI_TOKENS),
                   min_token_agreement=spec.get("min_token_agreement", 0.75),
                   min_cosine=spec.get("min_cosine", 0.95), min_kv_cosine=spec.get("min_kv_cosine", MIN_KV_COSINE),
                   simulator=spec.get("simulator", "auto"), adapters=adapters, slot_parts=slot_parts, alpha=alpha,
                   tokenizer=tokenizer, prompt_tokenizer=prompt_tokenizer, quality=quality,
                   quantization=quantization)


def _quality(f: Path, spec: dict[str, Any], model: Path, tokenizer: tuple[Path, ...], cl: int, at: Any) -> Quality:
    """llm.eval and the gates; the evaluation text checked here (one line naming the field)."""
    ev = spec.get("eval", {})
    tok = next((p for p in tokenizer if p.name == "tokenizer.json"), None) or (
        model.parent / "tokenizer.json" if (model.parent / "tokenizer.json").is_file() else None)
    text = DEFAULT_TEXT
    if "text" in ev:
        text = named_path(f.parent, ev["text"])
        if outside(text, f.parent, model.parent):
            raise RecipeError(f"{at('eval', 'text')}: llm.eval.text '{ev['text']}' is outside the recipe's directory "
                              f"({f.parent}) and the model's ({model.parent})", COPIED_HINT)
        if not text.is_file():
            raise RecipeError(f"{at('eval', 'text')}: llm.eval.text '{ev['text']}' not found (looked in {text})",
                              "a UTF-8 text file, relative to the recipe")
        if tok is None:
            raise RecipeError(f"{at('eval', 'text')}: llm.eval.text needs the export's tokenizer.json to read it",
                              "list it under llm.tokenizer, or keep it beside the model")
    return Quality(text=text, text_given="text" in ev, tokenizer=tok, segments=ev.get("segments", -(-PPL_TOKENS // cl)),
                   tokens=ev.get("tokens", EVAL_TOKENS), simulator=dict(ev.get("simulator", {})),
                   max_ppl_ratio=spec.get("max_ppl_ratio", MAX_PPL_RATIO),
                   min_agreement=spec.get("min_agreement", MIN_AGREEMENT))


def _quantization(at: Any, spec: dict[str, Any], precision: str, facts: dict[str, Any]) -> dict[str, Any] | None:
    """llm.quantization with its defaults, for every integer precision (None for fp16); exit 2 where the HTP
    simulator was measured not to run the blocks. Decision: without the field, w8a16 weights are per channel and
    w4a16's block-wise (LPBQ, block 32), not one scale per matrix as onnxruntime's QNN config writes them: on
    SmolLM2-135M at w8a16 the CPU perplexity ratio was 1.123x per matrix, 1.062x per channel (docs/llm-reference.md,
    Trained decoders); `int8: tensor` asks for onnxruntime's."""
    from ctxbuild.llm.int4 import FAILED_BLOCKS, FAILED_HOW, blockable

    q = spec.get("quantization")
    if q is None and precision == "fp16":
        return None
    q = q or {}
    if precision == "fp16":
        raise RecipeError(f"{at('quantization')}: llm.quantization sets how integer weights are made; precision is "
                          "fp16", "remove llm.quantization, or use precision: w4a16 or w8a16")
    for key in ("int4", "block_size", "keep_8bit_share"):
        if key in q and precision not in ("w4a16", "auto"):
            raise RecipeError(f"{at('quantization', key)}: {key} is for int4 weights; precision is {precision}",
                              f"remove {key}, or use precision: w4a16")
    if "block_size" in q and q.get("int4", "block") != "block" and precision != "auto":
        raise RecipeError(f"{at('quantization', 'block_size')}: block_size is for int4: block",
                          "add int4: block, or remove block_size")
    out = {"int4": q.get("int4", "block"), "block_size": q.get("block_size", BLOCK_SIZE),
           "int8": q.get("int8", "channel"), "scale_search": q.get("scale_search", False),
           "keep_8bit_share": q.get("keep_8bit_share", 0.0)}
    if out["int4"] == "block" or precision == "auto":
        bs = out["block_size"]
        for name, rows in sorted(facts.get("matmul_rows", {}).items()):
            if blockable(rows, bs) and rows // bs in FAILED_BLOCKS.get(bs, ()):
                raise RecipeError(
                    f"{at('quantization', 'block_size')}: block_size {bs} cuts {name} ({rows} rows) into "
                    f"{rows // bs} blocks: the HTP simulator {FAILED_HOW[bs]} on {rows // bs} blocks of {bs} rows "
                    "(onnxruntime-qnn 2.7.0)", "use block_size 32 (it ran at every block count measured)")
    return out


BLOCK_SIZE = 32  # llm.quantization.block_size default: the size the simulator ran at every block count measured


# what llm_package, llm_part_eval and llm_genai write into the same directory (its stage files are *.onnx, wrappers
# *_ctx.onnx)
PACKAGE_FILES = ("genai_config.json", "llm_verify", "genai_verify.json", "cpu_twin")
BUILT_SUFFIXES = (".onnx", ".bin", ".onnx_adapter", ".data")  # what else the build writes there


COPIED_HINT = ("what a build reads into OUT and the cache must come from the project: keep it beside the recipe or "
               "the model")


def _tokenizer_files(f: Path, model_dir: Path, names: list[str], at: Any) -> tuple[Path, ...]:
    paths: dict[str, Path] = {}
    for i, name in enumerate(names):
        path = named_path(f.parent, name)
        if outside(path, f.parent, model_dir):
            raise RecipeError(f"{at('tokenizer', i)}: tokenizer file '{name}' is outside the recipe's directory "
                              f"({f.parent}) and the model's ({model_dir})", COPIED_HINT)
        if not path.is_file():
            raise RecipeError(f"{at('tokenizer', i)}: tokenizer file '{name}' not found (looked in {path})",
                              "the runtime's tokenizer files (tokenizer.json, ...), relative to the recipe")
        clash = (f"its name clashes with {paths[path.name]}" if path.name in paths else
                 f"its name is one the build writes beside genai_config.json ({path.name})" if path.name in PACKAGE_FILES
                 else "it is named like a file the build writes there (*.onnx wrappers and stages, *_qnn.bin context "
                 "binaries, *.onnx_adapter)" if path.suffix in BUILT_SUFFIXES else None)
        if clash:
            raise RecipeError(f"{at('tokenizer', i)}: tokenizer file '{name}': {clash}",
                              "each file is copied by name into the output directory; rename it")
        paths[path.name] = path
    return tuple(paths.values())


def _adapters(f: Path, data: LineDict, spec: dict[str, Any], precision: str, facts: dict[str, Any],
              model: str) -> tuple[Adapters, tuple[int, ...]]:
    """llm.adapters (the `adapters:` block of other recipes, nested) and where its slots are read. Each slot pattern
    must name an initializer or input of the decoder that a node reads."""
    def at(*path: str | int) -> str:
        return f"{f}:{line_of(data, ['llm', 'adapters', *path])}"

    if precision == "fp16":  # the float graphs would go to the compiler with the slots' defaults as initializers
        raise RecipeError(f"{at()}: llm.adapters with precision fp16 is not built yet",
                          "use precision w8a16 or w4a16 (the slots are uint16 inputs there)")
    adapters = parse_adapters(f, data, spec["adapters"], precision, ("llm", "adapters"))
    readers: dict[str, list[int]] = facts.get("readers", {})
    if not readers:  # the model did not parse: llm_split reports it
        return adapters, ()
    wheres: set[int] = set()
    patterns = [("slots", i, p) for i, p in enumerate(adapters.slots)]
    patterns += [("scaling", None, adapters.scaling)] if adapters.scaling else []
    for key, i, pattern in patterns:
        hits = fnmatch.filter(readers, pattern)
        if not hits:
            lora = [n for n in readers if "lora" in n.lower()]
            example = lora[0] if lora else next((n for n in readers if "proj" in n), next(iter(readers)))
            raise RecipeError(f"{at(key, *([i] if i is not None else []))}: '{pattern}' names no initializer or "
                              f"input of {model}", f"a name or glob pattern of its LoRA weights, e.g. {example!r}")
        wheres.update(w for n in hits for w in readers[n])
    return adapters, tuple(sorted(wheres))


def _alpha(f: Path, data: LineDict, spec: dict[str, Any], precision: str, facts: dict[str, Any]
           ) -> tuple[AlphaSwitch, tuple[int, ...]]:
    """llm.adapters with switch: alpha, and where the adapted weights are read: the parts taking lora_alpha (each of
    them the same vector). A module found by its weight `<module>.weight`; otherwise every part."""
    from ctxbuild.lora.alpha import modules

    if precision == "fp16":
        raise RecipeError(f"{f}:{line_of(data, ['llm', 'adapters', 'switch'])}: llm.adapters with switch: alpha at "
                          "precision fp16 is not built yet", "use precision w8a16 or w4a16")
    alpha = parse_alpha(f, data, spec["adapters"], precision, bundle=False, multi_soc=False, where=("llm", "adapters"))
    readers: dict[str, list[int]] = facts.get("readers", {})
    wheres: set[int] = set()
    for a in alpha.items:
        for module in modules(a.file, dict(a.tensors)):
            weight = dict(alpha.targets).get(module, f"{module}.weight")
            if weight not in readers:
                return alpha, ()  # a node named in targets, or not found by weight: every part (split says which)
            wheres.update(readers[weight])
    return alpha, tuple(sorted(wheres))


def _parts_reading(wheres: tuple[int, ...], layers: int | None, parts: int) -> tuple[int, ...]:
    """The parts holding these wheres (layers, FIRST, LAST); every part when the model was not read."""
    from ctxbuild.llm.static import part_ranges

    if layers is None or not wheres:
        return tuple(range(parts))
    ranges = part_ranges(layers, parts)
    return tuple(sorted({_part_of(w, ranges) for w in wheres}))


def _part_of(where: int, ranges: list[tuple[int, int]]) -> int:
    """The part holding a where (a layer; FIRST: the embedding's part; LAST: what follows the layers)."""
    from ctxbuild.llm.canonical import FIRST, LAST

    return 0 if where == FIRST else len(ranges) - 1 if where == LAST else \
        next(p for p, (lo, hi) in enumerate(ranges) if lo <= where < hi)


def part_weight_bytes(facts: dict[str, Any], parts: int, precision: str, keep_8bit: list[str] | None) -> list[float]:
    """Estimated weight bytes per part: its layers' matrices at the precision's width (int8 for the embedding, the LM
    head and keep_8bit at w4a16), the embedding in the first part, what follows the layers in the last."""
    from ctxbuild.llm.canonical import FIRST, LAST
    from ctxbuild.llm.static import part_ranges

    ranges = part_ranges(facts["layers"], parts)
    kept = keep_8bit if keep_8bit is not None else \
        ["model.layers.0.*", f"model.layers.{facts['layers'] - 1}.*"]  # the default (parse_llm)
    out = [0.0] * parts
    for name, elements, where in facts["weight_sizes"]:
        width = precisions.get(precision).llm_weight_bytes
        if precision == "w4a16" and (where in (FIRST, LAST) or any(fnmatch.fnmatchcase(name, k) for k in kept)):
            width = 1.0
        out[_part_of(where, ranges)] += elements * width
    return out


def _parts_for_budget(where: str, model: str, facts: dict[str, Any], precision: str, budget_mb: float,
                      keep_8bit: list[str] | None) -> int:
    """The fewest parts whose every part's estimated weight bytes fit the budget (MB = 10^6 bytes)."""
    if "weight_sizes" not in facts:
        raise RecipeError(f"{where}: part_max_mb: {model} could not be read as an ONNX decoder",
                          "give parts: N instead, or a model ctxbuild can read")
    for parts in range(1, facts["layers"] + 1):
        sizes = part_weight_bytes(facts, parts, precision, keep_8bit)
        if max(sizes) <= budget_mb * 1e6:
            return parts
    raise RecipeError(f"{where}: part_max_mb {budget_mb}: even one layer per part needs {max(sizes) / 1e6:.3f} MB "
                      f"of {precision} weights in a part", "raise part_max_mb, or use a smaller precision (w4a16)")
