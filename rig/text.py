"""Making job-supplied text safe to print on a person's terminal. One rule, one place.

Names, commands, reasons, failure evidence, environment names, working folders, user names and
wait reasons come from submitters and from jobs' own output: any of them may carry terminal
control sequences (an ``ESC ] 0 ; TITLE`` that renames the window, a CSI that clears the
screen or hides what follows, a lone ESC that swallows the next character, C1 controls that
some terminals act on). Every human view (tables, one-line messages, ``rig top``) passes such
text through :func:`clean` before it reaches the terminal; ``--json`` keeps the raw values
(JSON escapes control characters itself). ``rig log`` prints a job's output as it is, as
``cat`` would: it is the job's own output, asked for by name.

:func:`clean` NEVER removes a character (issue 10, item 9, found from outside: stripping a
sequence also stripped the text inside it, so ``rig show`` said ``echo safe`` for a command
that went on to ``touch`` a file). Instead every character a terminal may act on, or that hides
or reorders text, is *shown* as an escape, so the terminal receives no control byte and a
person sees every character that is really there:

- C0 controls (ESC included) and DEL become ``\\xHH`` (ESC -> ``\\x1b``). Newline and tab
  stay when ``multiline``; in a one-line field (names, commands, reasons) each becomes a space,
  as before (both are whitespace a person sees as such);
- C1 controls U+0080..U+009F (the 8-bit CSI U+009B included) become ``\\x80``..``\\x9f``;
- Unicode format characters (category Cf: bidi overrides and isolates U+202A..U+202E,
  U+2066..U+2069, marks U+200E/U+200F/U+061C, zero-width spaces and joiners, the BOM, soft
  hyphen, tag characters), line and paragraph separators (U+2028, U+2029) and lone surrogates
  (undecodable bytes read with ``surrogateescape``) become ``\\uHHHH`` (``\\UHHHHHHHH`` above
  U+FFFF).

Backslashes: shown as typed (``printf 'a\\n'`` stays as it is), except that a run of
backslashes directly before text that reads like one of these escapes (``x`` + 2 hex digits,
``u`` + 4, ``U`` + 8) or before an escaped character is doubled. So the output reads back
unambiguously: an odd run before an escape is ``(n-1)/2`` backslashes and the escaped
character; an even run is ``n/2`` backslashes and the literal text. A submitted ``\\x1b``
(four characters) shows as ``\\\\x1b``; a real ESC as ``\\x1b``.

:func:`markup` also escapes rich markup, for text printed through rich's markup parser, so
``[not in whitelist]`` or ``[/]`` in a job's name shows as typed instead of being eaten.
"""

from __future__ import annotations

import re
import unicodedata

from rich.markup import escape

#: Unicode categories shown escaped: format characters (bidi controls, zero-width characters,
#: tags), line/paragraph separators, surrogates. C0/C1/DEL (category Cc) are handled by range.
_ESCAPED_CATEGORIES = frozenset({"Cf", "Zl", "Zp", "Cs"})
#: Text after a backslash that would read as one of clean()'s own escapes.
_ESCAPE_SHAPE = re.compile(r"x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}")


def _escaped(ch: str, multiline: bool) -> str | None:
    """How ``ch`` is shown: None when as itself, else its visible stand-in."""
    o = ord(ch)
    if ch in "\n\t":
        return None if multiline else " "
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return f"\\x{o:02x}"
    if o < 0xA0:
        return None
    if unicodedata.category(ch) in _ESCAPED_CATEGORIES:
        return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"
    return None


def clean(text: object, *, multiline: bool = False) -> str:
    """``text`` (anything: str() is taken, None becomes "") with every terminal control and
    hiding/reordering character shown as a visible escape (see the module doc); nothing is
    removed. Newlines and tabs stay when ``multiline``, else each becomes a space (one-line
    fields). Never raises."""
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable() and "\\" not in s:  # the common case, fast (isprintable: no C0/C1/DEL/Cf)
        return s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            j = i
            while j < n and s[j] == "\\":
                j += 1
            run = j - i
            nxt = s[j] if j < n else ""
            # Doubled only where it could be read as (part of) an escape: see the module doc.
            ambiguous = bool(nxt) and (_ESCAPE_SHAPE.match(s, j) is not None
                                       or _escaped(nxt, multiline) not in (None, " "))
            out.append("\\" * (2 * run if ambiguous else run))
            i = j
            continue
        shown = _escaped(ch, multiline)
        out.append(ch if shown is None else shown)
        i += 1
    return "".join(out)


def markup(text: object, *, multiline: bool = False) -> str:
    """:func:`clean`, then escaped for rich's markup parser (for ``console.print`` and table
    cells that are parsed as markup)."""
    return escape(clean(text, multiline=multiline))


def has_control(data: str | bytes) -> bool:
    """Does ``data`` hold any character a terminal may act on or that hides or reorders text
    (ESC, C0 other than newline and tab, DEL, C1, format characters, separators)? For tests
    and checks; bytes are read as UTF-8."""
    s = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return any(_escaped(ch, True) is not None for ch in s)
