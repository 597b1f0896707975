"""Action implementations, one module per kind (ctxbuild/plan/kinds/ registers them). Each defines
`run(ctx)`: write every output into `ctx.tmp` under its final file name; raise ActionError on bad input.
Optional hooks (defaults: nothing):

- `discover_inputs(action) -> dict[name, Path]`: files read beyond the declared inputs (external data,
  calibration samples), found cheaply before running so they join the action key and ninja's depfile;
- `warnings(action) -> list[str]`: what the user must see whether the action runs or restores from cache;
- `summarize(action) -> dict`: facts about the placed outputs for the record (graph names, metrics);
- `key_extras(action) -> dict`: anything else the outputs depend on (e.g. SOURCE_DATE_EPOCH), keyed;
- `check_outputs(action, outputs: dict[role, Path])`: raise ActionError if outputs (freshly made in the temp
  dir, or restored from the cache) are not what the action promises (e.g. a binary for another SoC).
"""
