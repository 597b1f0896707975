"""What `compile.cpu_fallback` costs a graph: how many NPU partitions it is cut into, how many nodes run on the
CPU, and their share of the model's multiply-accumulates (graph/macs.py). Measured on the wrapper a fallback
compile writes: every node outside an EPContext node is one onnxruntime runs on the CPU, under its own name (an
unnamed one under its first output's, graph/nodenames.key)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Fallback:
    partitions: int
    cpu_nodes: list[tuple[str, str]]  # (name, op type)
    cpu_macs: int
    total_macs: int
    unknown: list[tuple[str, str, bool]] = field(default_factory=list)  # (node, op, on the CPU): MACs not countable

    def describe(self) -> str:
        """'18 NPU partitions, 36 nodes (29.9% of the model's MACs) on the CPU'; nodes whose MACs are unknown
        are named after it."""
        share = (f"{100 * self.cpu_macs / self.total_macs:.1f}% of the model's MACs" if self.total_macs
                 else "the model has no MACs counted")
        return (f"{self.partitions} NPU partition{'s' * (self.partitions != 1)}, {len(self.cpu_nodes)} "
                f"node{'s' * (len(self.cpu_nodes) != 1)} ({share}) on the CPU" + unknown_note(self.unknown))

    def as_dict(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "cpu_nodes": len(self.cpu_nodes), "cpu_macs": self.cpu_macs,
                "total_macs": self.total_macs, "cpu_ops": dict(Counter(op for _, op in self.cpu_nodes)),
                **({"macs_unknown": [{"node": n, "op": op, "on": "CPU" if cpu else "NPU"}
                                     for n, op, cpu in self.unknown]} if self.unknown else {})}


def unknown_note(unknown: list[tuple[str, str, bool]]) -> str:
    """'; MACs unknown for lstm_2 (LSTM, on the CPU)': what a share leaves out, said."""
    if not unknown:
        return ""
    named = ", ".join(f"{n} ({op}, on the {'CPU' if cpu else 'NPU'})" for n, op, cpu in unknown[:3])
    return f"; MACs unknown for {named}" + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")


def of_wrapper(model: Any, wrapper: Any) -> Fallback:
    """The cost of `wrapper` (a fallback compile's EPContext model, graph only) of `model` (the compiled source)."""
    from ctxbuild.graph.macs import node_macs, share, uncounted
    from ctxbuild.graph.nodenames import key

    cpu = [(key(n) or "?", n.op_type) for n in wrapper.graph.node if n.op_type != "EPContext"]  # unnamed: by output
    macs = node_macs(model)
    on_cpu, total = share(macs, {name for name, _ in cpu})
    ops = {key(n): n.op_type for n in model.graph.node}
    unknown = [(n, ops.get(n, "?"), n in {name for name, _ in cpu}) for n in uncounted(macs)]
    return Fallback(sum(n.op_type == "EPContext" for n in wrapper.graph.node), cpu, on_cpu, total, unknown)


def probe(src: Path, provider_options: dict[str, str], tmp: Path) -> Fallback | None:
    """Compile `src` once more with CPU fallback (in a child: a crash fails only the probe) and measure it;
    None when that compile fails too."""
    import onnx

    from ctxbuild.errors import ActionError
    from ctxbuild.graph.modelio import load
    from ctxbuild.qnn import isolated
    from ctxbuild.toolchain import installed as toolchain

    dst = tmp / "probe" / "probe_ctx.onnx"
    dst.parent.mkdir(exist_ok=True)
    try:
        toolchain.qnn_devices()
        isolated.call(toolchain.compile_model, src, dst, provider_options, embed=True, cpu_fallback=True,
                      what="the fallback probe compile", hint="")
        wrapper = onnx.load(str(dst), load_external_data=False)
    except (ActionError, RuntimeError, OSError):  # best effort: the caller still reports QNN's own message
        return None
    return of_wrapper(load(src, external_data=False), wrapper)
