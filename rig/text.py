"""Making job-supplied text safe to print on a person's terminal. One rule, one place.

Names, commands, reasons, failure evidence, environment names, working folders, user names and
wait reasons come from submitters and from jobs' own output: any of them may carry terminal
control sequences (an ``ESC ] 0 ; TITLE`` that renames the window, a CSI that clears the
screen or hides what follows, a lone ESC that swallows the next character, C1 controls that
some terminals act on). Every human view (tables, one-line messages, ``rig top``) passes such
text through :func:`clean` before it reaches the terminal; ``--json`` keeps the raw values
(JSON escapes control characters itself). ``rig log`` prints a job's output as it is, as
``cat`` would: it is the job's own output, asked for by name.

What :func:`clean` removes:

- ESC sequences: CSI (``ESC [`` ... final byte), OSC / DCS / SOS / PM / APC strings (``ESC ]``
  ... up to BEL or ``ESC \\``; an unterminated one loses only its introducer, so its text
  stays visible), any other ``ESC`` + one character, and a lone ESC at the end;
- C1 controls U+0080..U+009F (the 8-bit CSI U+009B included) and DEL;
- C0 controls except newline and tab; those two become a space unless ``multiline``;
- Unicode bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069, U+200E,
  U+200F, U+061C), which reorder what a person reads.

:func:`markup` also escapes rich markup, for text printed through rich's markup parser, so
``[not in whitelist]`` or ``[/]`` in a job's name shows as typed instead of being eaten.
"""

from __future__ import annotations

import re

from rich.markup import escape

# ESC followed by: CSI parameters/intermediates and a final byte; a string command (OSC, DCS,
# SOS, PM, APC) up to its terminator (BEL or ST; an unterminated one matches the last branch,
# which takes ESC and the introducer only); or any one other character (nF sequences'
# intermediates included); or nothing (a lone ESC at the end).
_ESCAPE = re.compile(
    r"\x1b(?:"
    r"\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"  # CSI ... final (a cut-off CSI too)
    r"|[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"  # OSC/DCS/SOS/PM/APC ... BEL | ST
    r"|[\x20-\x2f]*[\x30-\x7e]?"  # nF / Fp / Fe / Fs: intermediates then a final byte
    r")"
    # The 8-bit forms of CSI and OSC/DCS/... (a C1 introducer) with their parameters.
    r"|\x9b[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
)
# Whatever control characters remain after the sequences are gone (newline and tab apart).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile("[\n\t]")


def clean(text: object, *, multiline: bool = False) -> str:
    """``text`` (anything: str() is taken, None becomes "") without terminal control
    sequences or control characters. Newlines and tabs stay when ``multiline``, else each
    becomes a space (one-line fields: names, reasons, commands). Never raises."""
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable() and "\x1b" not in s:  # the common case, fast (isprintable: no C0/C1/DEL)
        return s
    s = _ESCAPE.sub("", s)
    s = _CONTROL.sub("", s)
    return s if multiline else _LINE_BREAKS.sub(" ", s)


def markup(text: object, *, multiline: bool = False) -> str:
    """:func:`clean`, then escaped for rich's markup parser (for ``console.print`` and table
    cells that are parsed as markup)."""
    return escape(clean(text, multiline=multiline))


def has_control(data: str | bytes) -> bool:
    """Does ``data`` hold any byte or character a terminal may act on (ESC, C0 other than
    newline and tab, DEL, C1, bidi overrides)? For tests and checks; bytes are read as UTF-8."""
    s = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return "\x1b" in s or bool(_CONTROL.search(s))
