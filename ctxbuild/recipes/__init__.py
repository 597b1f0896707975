"""Recipes: YAML with line numbers, the JSON Schema, the SoC table and targets, quantization settings."""
