"""The canonical decoder form the static pass cuts, which every exporter's convention is rewritten into:
plain ONNX ops; `input_ids`, `attention_mask`, `position_ids`, `past_key_values.N.key/value` in; `logits`,
`present.N.key/value` out; node scopes `/model/layers.N/`. Its names, the mask value and the shared types."""
from __future__ import annotations

import re
from dataclasses import dataclass

MASK_NEG = -100.0  # what the runtime writes into masked slots: small enough for 16-bit activations' resolution
PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
LAYER = re.compile(r"/model/layers\.(\d+)/")  # the exporters' node scopes, which the static pass cuts by
FIRST, LAST = -1, -2  # weight_sizes: the embedding (first part), what follows the layers (last part)


class NotADecoder(ValueError):
    """The model is not a decoder ctxbuild can make static graphs of: the message says why and what to do."""


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    hidden: int  # the embedding table's width
