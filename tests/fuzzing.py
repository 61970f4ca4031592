"""What the fuzz tests share: example counts (raised by DIFFILL_FUZZ_EXAMPLES) and strategies for editor text.

The CI run keeps every fuzz test's example count small (all of them together add about two minutes on two cores);
`DIFFILL_FUZZ_EXAMPLES=20000 pytest tests -k fuzz` runs each with that many examples instead (docs/RELIABILITY.md).
"""

from __future__ import annotations

import os

from hypothesis import settings, strategies as st

EXAMPLES_VARIABLE = "DIFFILL_FUZZ_EXAMPLES"


def examples(ci: int) -> settings:
    """Hypothesis settings running `ci` examples, or $DIFFILL_FUZZ_EXAMPLES when it is set."""
    wanted = os.environ.get(EXAMPLES_VARIABLE, "").strip()
    if wanted and not wanted.isdigit():
        raise ValueError(f"{EXAMPLES_VARIABLE} must be a positive integer (got {wanted!r})")
    # the CI run draws the same examples every time (a failure there is reproducible, never a flake); a longer run
    # asked for by $DIFFILL_FUZZ_EXAMPLES draws new ones
    return settings(max_examples=int(wanted) if wanted else ci, derandomize=not wanted)


# Characters an editor buffer holds: ASCII code, tabs, every kind of line break, accented letters, CJK, astral
# characters (two UTF-16 units, four UTF-8 bytes), combining marks, zero-width joiners, and now and then anything.
_PIECES = st.sampled_from([
    "a", "x", "_", "0", " ", "    ", "\t", "\n", "\r\n", "\r", "\n\n", "(", ")", "{", "}", "[", "]", '"', "'", "`",
    "#", "//", "/*", "*/", "--", "\\", ";", ":", ",", "é", "ß", "日本", "\u0301", "\u200d", "\ufeff", "😀", "👨‍👩‍👧",
    "𝔘", "\U0010ffff", "\x00", "\x7f", "\u2028",
])
editor_text = st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=40).map("".join)
"""Random editor text, built from the pieces above and from arbitrary code points."""
