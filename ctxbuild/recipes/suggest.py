"""The one "did you mean" of ctxbuild's error hints (recipe keys and values, SoC names, --only/--target)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str], *, otherwise: str | None = None, cutoff: float = 0.6,
                 n: int = 1) -> str | None:
    """"did you mean 'x'?" for the option closest to `word` (one that differs in case only first), else `otherwise`;
    with `n`, up to n close ones, closest first: "did you mean 'SM8750', 'SM8550' or 'SM8850'?"."""
    options = list(dict.fromkeys(options))
    same = [o for o in options if o.lower() == word.lower()][:1]
    close = same or closest(word, options, n=n, cutoff=cutoff)
    if not close:
        return otherwise
    quoted = [f"'{c}'" for c in close]
    return f"did you mean {' or '.join(filter(None, [', '.join(quoted[:-1]), quoted[-1]]))}?"


def closest(word: str, options: list[str], *, n: int, cutoff: float) -> list[str]:
    """Up to `n` of difflib's close matches, fewest edits first (a swap of two neighbours is one: SM8570 is one
    edit from SM8750 and from SM8550, two from SM8850), then in difflib's order."""
    found = difflib.get_close_matches(word, options, n=len(options), cutoff=cutoff)
    return sorted(found, key=lambda o: _edits(word.lower(), o.lower()))[:n]


def _edits(a: str, b: str) -> int:
    """Damerau-Levenshtein distance (optimal string alignment): insertions, deletions, substitutions, swaps."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]
