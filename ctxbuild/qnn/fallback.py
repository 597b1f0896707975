"""What `compile.cpu_fallback` costs a graph: how many NPU partitions it is cut into, how many nodes run on the
CPU, and their share of the model's multiply-accumulates (graph/macs.py). Measured on the wrapper a fallback
compile writes: every node outside an EPContext node is one onnxruntime runs on the CPU, under its own name (an
unnamed one under its first output's, graph/nodenames.key)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Fallback:
    partitions: int
    cpu_nodes: list[tuple[str, str]]  # (name, op type)
    cpu_macs: int
    total_macs: int

    def describe(self) -> str:
        """'18 NPU partitions, 36 nodes (29.9% of the model's MACs) on the CPU'."""
        share = (f"{100 * self.cpu_macs / self.total_macs:.1f}% of the model's MACs" if self.total_macs
                 else "the model has no MACs counted")
        return (f"{self.partitions} NPU partition{'s' * (self.partitions != 1)}, {len(self.cpu_nodes)} "
                f"node{'s' * (len(self.cpu_nodes) != 1)} ({share}) on the CPU")

    def as_dict(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "cpu_nodes": len(self.cpu_nodes), "cpu_macs": self.cpu_macs,
                "total_macs": self.total_macs}


def of_wrapper(model: Any, wrapper: Any) -> Fallback:
    """The cost of `wrapper` (a fallback compile's EPContext model, graph only) of `model` (the compiled source)."""
    from ctxbuild.graph.macs import node_macs, share
    from ctxbuild.graph.nodenames import key

    cpu = [(key(n) or "?", n.op_type) for n in wrapper.graph.node if n.op_type != "EPContext"]  # unnamed: by output
    on_cpu, total = share(node_macs(model), {name for name, _ in cpu})
    return Fallback(sum(n.op_type == "EPContext" for n in wrapper.graph.node), cpu, on_cpu, total)


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
