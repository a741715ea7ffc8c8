"""Regular expressions in filters: MongoDB's options and PCRE spellings compiled for the
`regex` engine, and the time budget of one match.

A string matches when the pattern is found in it; a stored regex value matches when
it has the same pattern and options. A match runs under a `RegexBudget`: the one in
the `REGEX_BUDGET` context variable (query execution off the event loop sets one per
operation), else `DEFAULT_REGEX_BUDGET`; past it the query fails with the budget's
error, however the pattern backtracks.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import contextvars
import re
from typing import Any, NamedTuple

import regex
from bson.regex import Regex

from base.errors import MongoError
from oplog.query_common import Pred, _bad

__all__ = [
    "DEFAULT_REGEX_BUDGET",
    "REGEX_BUDGET",
    "REGEX_MATCH_LIMIT_S",
    "RegexBudget",
]


_REGEX_TYPES = (Regex, re.Pattern)
_REGEX_FLAG_CHARS = "imsxu"
_RE_FLAG_BITS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL, "x": regex.VERBOSE}


class RegexBudget(NamedTuple):
    """How long one regex match may run, and the error when it runs longer (the `regex` engine checks
    its timeout while it backtracks, so a pattern such as ``^(a|aa)+$`` cannot run away)."""

    seconds: float
    code: int
    message: str

    def error(self) -> MongoError:
        """A new error each time (one shared exception object would collect every raise's traceback)."""
        return MongoError(self.code, self.message)

    @classmethod
    def limited_to(cls, seconds: float) -> RegexBudget:
        """A budget of `seconds` per match, past which the query fails with BadValue."""
        return cls(seconds, 2, f"Regular expression match exceeded its limit of {int(seconds * 1000)} ms")


# A single match may take this long by default: a legitimate pattern on a document's string takes
# microseconds; this bounds a catastrophic one. Query execution off the event loop sets a budget per
# operation (the smaller of this and what its maxTimeMS leaves).
REGEX_MATCH_LIMIT_S = 0.1
DEFAULT_REGEX_BUDGET = RegexBudget.limited_to(REGEX_MATCH_LIMIT_S)
REGEX_BUDGET: contextvars.ContextVar[RegexBudget | None] = contextvars.ContextVar("regex_budget", default=None)
_INT_FLAG_CHARS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"), (re.VERBOSE, "x"))


def _flag_chars(flags: Any) -> str:
    """A regex's options as MongoDB letters (sorted, only i/m/s/x matter for equality)."""
    if isinstance(flags, str):
        return "".join(sorted(set(flags) & set("imsx")))
    return "".join(ch for bit, ch in _INT_FLAG_CHARS if int(flags) & bit)


def _regex_source(value: Any) -> tuple[str, str]:
    """``(pattern, options)`` of a bson Regex or compiled Python pattern."""
    pattern = value.pattern
    return (pattern.decode() if isinstance(pattern, bytes) else str(pattern), _flag_chars(value.flags))


def _translate_pcre(pattern: str) -> str:
    """Rewrite the PCRE spellings Python's `re` lacks or reads differently.

    ``(?<name>`` becomes ``(?P<name>``; PCRE's ``\\z`` (very end) is Python's ``\\Z``, and
    PCRE's ``\\Z`` (end, or before a final newline) becomes ``(?=\\n?\\Z)``.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            out.append({"z": "\\Z", "Z": "(?=\\n?\\Z)"}.get(nxt, ch + nxt))
            i += 2
            continue
        if pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _compile_regex(pattern: str, options: str) -> regex.Pattern[str]:
    for ch in options:
        if ch not in _REGEX_FLAG_CHARS:
            raise MongoError(51108, f"invalid flag in regex options: {ch}")
    if "\x00" in pattern:
        raise _bad("Regular expression cannot contain an embedded null byte")
    bits = 0
    for ch in options:
        bits |= _RE_FLAG_BITS.get(ch, 0)
    try:
        return regex.compile(_translate_pcre(pattern), bits)
    except (regex.error, re.error) as exc:
        raise MongoError(51091, f"Regular expression is invalid: {exc}") from None


def _regex_pred(pattern: str, options: str) -> Pred:
    """Matches strings the regex finds, and stored regexes with the same pattern and options."""
    rx = _compile_regex(pattern, options)
    source = (pattern, _flag_chars(options))
    search = rx.search

    def pred(x: Any) -> bool:
        if x.__class__ is str:
            budget = REGEX_BUDGET.get() or DEFAULT_REGEX_BUDGET
            try:
                return search(x, timeout=budget.seconds, concurrent=True) is not None
            except TimeoutError:
                raise budget.error() from None
        if isinstance(x, _REGEX_TYPES):
            return _regex_source(x) == source
        return False

    return pred


def _regex_value_pred(value: Any) -> Pred:
    pattern, flags = _regex_source(value)
    if isinstance(value, Regex) and isinstance(value.flags, str):
        flags = value.flags
    return _regex_pred(pattern, flags)
