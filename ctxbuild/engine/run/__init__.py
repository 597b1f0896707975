"""Running one action: the edge client ninja starts, the pre-imported worker that forks it, the runner that keys,
restores or runs it and places its outputs."""
