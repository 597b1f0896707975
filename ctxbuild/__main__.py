import sys

try:
    from .cli import entry
except KeyboardInterrupt:  # Ctrl-C while still importing: the same exit as later on
    print("ctxbuild: interrupted", file=sys.stderr)
    sys.exit(130)

entry()
