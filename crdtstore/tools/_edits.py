"""``store_text_edit``'s plan: the text after a list of find/replace and splice edits, or a
refusal (EDIT_REFUSED) that changes nothing. Pure functions."""

from __future__ import annotations

from . import _args as A
from ._results import ToolFailure


def occurrences(text: str, find: str) -> list[int]:
    """Every start of ``find`` in ``text``, overlapping ones included."""
    out: list[int] = []
    i = text.find(find)
    while i >= 0 and len(out) < 2:
        out.append(i)
        i = text.find(find, i + 1)
    return out


def plan_edits(text: str, edits: list[A.FindReplace | A.Splice], version: int) -> str:
    """The text after ``edits``, applied in order; refuses (EDIT_REFUSED) the whole call if
    one ``find`` is absent or ambiguous, or a splice is out of range. The refusal names the
    edit and the text as it is now (``current``: version and length, before any edit)."""
    current = {"version": version, "length": len(text)}
    for n, edit in enumerate(edits):
        if isinstance(edit, A.FindReplace):
            found = occurrences(text, edit.find)
            if len(found) != 1:
                reason = "not_found" if not found else "ambiguous"
                raise ToolFailure(
                    "EDIT_REFUSED",
                    f"edit {n}: `find` text "
                    + ("does not occur" if not found else "occurs more than once")
                    + " in the text; re-read it and make `find` unique",
                    reason=reason, edit=n, current=current,
                )  # fmt: skip
            at = found[0]
            text = text[:at] + edit.replace + text[at + len(edit.find) :]
        else:
            if edit.at + edit.delete > len(text):
                raise ToolFailure(
                    "EDIT_REFUSED",
                    f"edit {n}: {edit.delete} characters at {edit.at} pass the end of the text"
                    f" ({len(text)} characters after the edits before it)",
                    reason="out_of_range", edit=n, current=current,
                )  # fmt: skip
            text = text[: edit.at] + edit.insert + text[edit.at + edit.delete :]
    return text
