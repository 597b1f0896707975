"""Verification beyond one action: per-slice metrics, the verification memo, the per-layer diagnosis."""
