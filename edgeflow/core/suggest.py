"""'Did you mean' suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The closest valid name to `word`, or None when nothing is close."""
    options = list(choices)
    matches = difflib.get_close_matches(str(word), options, n=1, cutoff=0.5)
    if matches:
        return matches[0]
    lowered = {c.lower(): c for c in options}
    return lowered.get(str(word).lower())


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    options = list(choices)
    guess = closest(word, options)
    listed = ", ".join(options)
    if guess:
        return f"did you mean '{guess}'? (valid: {listed})"
    return f"valid: {listed}" if options else None
