"""`python -m ctxbuild`: the same as the `ctxbuild` command."""
import os
import sys

try:
    from ctxbuild.cli.main import entry
except KeyboardInterrupt:  # Ctrl-C while still importing: the same exit as later on (see cli.entry)
    print("ctxbuild: interrupted", file=sys.stderr, flush=True)
    os._exit(130)

entry()
