"""A recipe's `inputs:` checked against the model's graph inputs when planning: a wrong name, rank or fixed
dim, or a dynamic dim left open, is a recipe error with file:line (not a failed prepare action)."""
from __future__ import annotations

import math
from pathlib import Path

from ctxbuild.errors import RecipeError
from ctxbuild.graph.signature import LAYOUTS, Dim, graph_input_shapes

MAX_INPUT_ELEMENTS = 2**30  # 4 GiB of float32: more than a 32-bit address space holds


def check(model: Path, given: dict[str, tuple[int, ...]], where: dict[str, str], default_where: str,
          fixed: frozenset[str] | set[str] = frozenset(), samples: Path | None = None) -> None:
    """`where`: input name -> `file:line` of its entry in the recipe; `default_where`: the recipe's `model:`;
    `fixed`: the inputs `input_values:` makes constants (no shape needed); `samples`: the calibration directory,
    whose first sample gives the shape to write for a dynamic input the recipe leaves open."""
    shapes = graph_input_shapes(model)
    if shapes is None:
        return
    for name, want in given.items():
        if name not in shapes:
            from ctxbuild.recipes.suggest import did_you_mean

            have = ", ".join(f"{n} {_fmt(s)}" for n, s in shapes.items())
            raise RecipeError(f"{where.get(name, default_where)}: inputs: '{name}' is not an input of {model.name}",
                              did_you_mean(name, list(shapes), otherwise=None) or f"its inputs are: {have}")
        _fits(model, name, list(want), shapes[name], where.get(name, default_where))
        if (size := math.prod(want)) > MAX_INPUT_ELEMENTS:  # QNN would try, for as long as it takes
            raise RecipeError(f"{where.get(name, default_where)}: inputs: '{name}' {_fmt(list(want))} holds "
                              f"{size:,} elements per sample, {size * 4 / 2**30:,.0f} GiB as float32: beyond what "
                              "the HTP (a 32-bit DSP) addresses", "give the shape the app feeds the model (a typo?)")
    for name, shape in shapes.items():
        if name not in given and name not in fixed and not all(isinstance(d, int) and d > 0 for d in shape):
            from ctxbuild.graph.samples import first_header

            found = first_header(samples, name, len(shapes) == 1) if samples else None
            if found and found[0] and found[0][0] and not _differs(list(found[0][0]), shape):
                hint = f"add inputs: {{{name}: {_fmt(list(found[0][0]))}}} (the shape of your sample {found[1]})"
            else:
                fill = ", ".join(str(d) if isinstance(d, int) and d > 0 else "1" for d in shape)
                hint = f"add inputs: {{{name}: [{fill}]}} (1 where the model leaves a dim open: use your real size)"
            raise RecipeError(f"{default_where}: input '{name}' of {model.name} has dynamic dims {_fmt(shape)}; "
                              "QNN needs fixed shapes", hint)


def _differs(want: list[int], shape: list[Dim]) -> bool:
    """`want` does not fit the model's `shape`: another rank, or a fixed dim of another size."""
    return len(want) != len(shape) or any(isinstance(d, int) and d > 0 and d != w for d, w in zip(shape, want))


def _fits(model: Path, name: str, want: list[int], shape: list[Dim], where: str) -> None:
    if not _differs(want, shape):
        return
    differ = [str(i) for i, (d, w) in enumerate(zip(shape, want)) if isinstance(d, int) and d > 0 and d != w]
    what = (f"rank {len(want)}, the model's is {len(shape)}" if len(want) != len(shape) else
            f"dim {differ[0]} differs" if len(differ) == 1 else f"dims {', '.join(differ)} differ")
    raise RecipeError(f"{where}: inputs: '{name}' is {_fmt(want)} in the recipe and {_fmt(shape)} in {model.name} "
                      f"({what})", _transpose_hint(want, shape) or f"give {name} the model's shape, its open dims fixed")


def _transpose_hint(want: list[int], shape: list[Dim]) -> str | None:
    """The recipe's dims are the model's in NHWC/NCHW order swapped: say so and give the model's order."""
    if len(want) != len(shape) or len(want) != 4:
        return None
    for perm, (layout, other) in LAYOUTS.items():
        moved = [want[p] for p in perm]
        if all(not (isinstance(d, int) and d > 0) or d == m for d, m in zip(shape, moved)):
            return f"the recipe's shape is {layout}, the model's input is {other}: write [{', '.join(map(str, moved))}]"
    return None


def _fmt(shape: list[Dim] | list[int]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


