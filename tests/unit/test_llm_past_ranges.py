"""llm_quantize gives each past KV input the range of every graph's calls (actions/llm_quantize.py past_ranges): a
prompt graph calibrated on prompts that fit its window sees an empty cache only, and with its own range (zeros) read
a long prompt's first window back as zeros (SmolLM2-135M at w8a16: each 128-token segment's second window 2-50x the
float perplexity, the first 1.0-1.1x)."""
from __future__ import annotations

import numpy as np

from ctxbuild.actions.llm_quantize import past_ranges
from ctxbuild.llm.pipeline import mask
from ctxbuild.llm.records import Call

AR, CL, KV = 8, 32, (2, 4)


def _call(ar: int, past: int, value: float) -> Call:
    cache = np.zeros((1, *KV[:1], CL - ar, KV[1]), np.float32)
    cache[:, :, :past] = value * np.linspace(-1, 1, past * KV[1]).reshape(1, 1, past, KV[1]) if past else 0
    feeds = {"attention_mask": mask(past, ar, ar, CL), "position_ids": (past + np.arange(ar))[None],
             "past_key_values.0.key": cache, "hidden_states.0": np.ones((1, ar, 16), np.float32)}
    return Call.of(0, ar, CL, feeds)


def test_a_prompt_graph_seeing_an_empty_cache_takes_the_token_graphs_range() -> None:
    feeds = {(0, AR, CL): [_call(AR, 0, 0.0), _call(AR, 0, 0.0)],  # prompts within one window: no past
             (0, 1, CL): [_call(1, 6, 3.0), _call(1, 7, 5.0)]}  # token steps read what the prompt wrote
    ranges = past_ranges(feeds)
    assert set(ranges) == {"past_key_values.0.key"}  # only the cache inputs; hidden states keep their own
    r = ranges["past_key_values.0.key"]
    assert (float(r["rmin"]), float(r["rmax"])) == (-5.0, 5.0)
    # the prompt graph's own calls alone would give a range of zeros: what the quantizer took before
    assert past_ranges({(0, AR, CL): feeds[(0, AR, CL)]}) == {}
