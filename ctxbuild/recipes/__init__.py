"""Recipes: YAML with line numbers, the JSON Schema, targets (the SoCs a recipe can target), quantization settings."""
