"""Toolchains: the versions that make an action's output, and how actions reach the QNN EP."""
