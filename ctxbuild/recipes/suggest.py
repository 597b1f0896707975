"""The one "did you mean" of ctxbuild's error hints (recipe keys and values, SoC names, --only/--target)."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, options: Iterable[str], *, otherwise: str | None = None, cutoff: float = 0.6) -> str | None:
    """"did you mean 'x'?" for the option closest to `word` (one that differs in case only first), else `otherwise`."""
    options = list(options)
    close = [o for o in options if o.lower() == word.lower()][:1] or difflib.get_close_matches(word, options, n=1,
                                                                                              cutoff=cutoff)
    return f"did you mean '{close[0]}'?" if close else otherwise
