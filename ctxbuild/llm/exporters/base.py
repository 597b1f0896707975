"""An LLM exporter's convention as a plug-in: how to recognise the decoders it writes and how to rewrite one
into the canonical form (llm/canonical.py) the static pass cuts.

A plug-in subclasses `Exporter` in its own module under llm/exporters/ and is imported once in the package's
__init__ (docs/internals.md, "Adding an exporter convention")."""
from __future__ import annotations

from typing import Any, ClassVar


class Exporter:
    name: ClassVar[str]  # as messages and the record name it
    inputs: ClassVar[tuple[str, ...]]  # the graph inputs its decoders have (check_decoder requires them)
    fallback: ClassVar[bool] = False  # matched only when no other plug-in claims the model

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(e.name == cls.name for e in REGISTRY):
            raise TypeError(f"exporter convention {cls.name!r} is registered twice")
        REGISTRY.append(cls)

    @classmethod
    def matches(cls, model: Any) -> bool:
        """Whether `model` (an onnx ModelProto, possibly without its external data) follows this convention."""
        raise NotImplementedError

    @classmethod
    def check(cls, model: Any) -> None:
        """Raise NotADecoder (saying what to do) if `to_canonical` would refuse `model`: the plan-time check."""

    @classmethod
    def to_canonical(cls, model: Any, base_dir: str, positions: int) -> Any:
        """The canonical-form equivalent of `model` (may modify it in place); `base_dir`: where its external data
        lives, for plug-ins that must read a tensor's values; `positions`: the largest context length the static
        graphs serve (position ids stay below it)."""
        return model

    @classmethod
    def fold_static(cls, model: Any) -> Any:
        """The canonical model with one static graph's shapes fixed (and inferred), before its parts are cut: what
        fixed shapes allow the convention (shape arithmetic folded to constants)."""
        return model


REGISTRY: list[type[Exporter]] = []
