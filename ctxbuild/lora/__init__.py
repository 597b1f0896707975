"""LoRA adapters end to end: the recipe block, adapter files and slots, their planned actions, the manifest list."""
