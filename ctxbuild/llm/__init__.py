"""LLMs on the NPU: an `llm:` recipe's decoder -> static part graphs per (part, AR, CL) -> weight-shared bundles."""
