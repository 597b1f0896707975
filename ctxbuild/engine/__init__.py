"""The driver: plan (re)use, ninja (render, quote, log), the console, OUT's safety and the end of a build; its
rooms: run/ (one action: the edge client, the fork server, the runner), fast/ (the paths that skip work: replan,
plan cache, restore before ninja, edited outputs, retargeted links), farm/ (a Dask cluster)."""
