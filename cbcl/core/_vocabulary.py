"""The lexical vocabulary of CBCL, defined once: atom patterns, kind names, binary codes.

Every module that recognises atoms (the reader's token expression, the value types'
constructors, the binary decoder) builds its expressions from the patterns here, so a
change to what a NAME or a DECIMAL is is made in one place. The binary token codes are
mirrored by the enum of ``cbcl/_native_src/speedups.c``; :func:`cbcl.binary._codec` checks
the two agree when it loads the extension.
"""

from __future__ import annotations

import re

#: The longest DECIMAL, in characters written out.
MAX_DECIMAL_CHARS = 40
# Characters a URI's rest excludes: space and controls, delimiters, bidirectional controls,
# and invisible characters (Unicode spaces, zero-width and directional marks, separators,
# BOM) that would let two URIs look alike.
INVISIBLE = "\u00a0\u061c\u1680\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff"
URI_REST_EXCLUDES = "\x00-\x20\x7f-\x9f()\";\u2066-\u2069" + INVISIBLE
#: A URI: a scheme, ``://``, then at least one character that is not excluded.
URI_PATTERN = r"[a-z][a-z0-9+.\-]*+://[^" + URI_REST_EXCLUDES + r"]++"

# --------------------------------------------------------------------------- atoms (draft §1)

#: A NAME's first character and the characters that may follow it.
NAME_START = r"[A-Za-z+\-*/<>=!?_.]"
NAME_REST = r"[A-Za-z0-9+\-*/<>=!?_.@%&]"
#: A NAME (possessive: it never backtracks).
NAME = NAME_START + NAME_REST + "*+"
#: What starts like a number: a token that does is a number or an error, never a symbol.
NUMBERLIKE = r"[+\-]?\.?[0-9]"
#: A symbol: a NAME that does not start like a number.
SYMBOL = r"(?!" + NUMBERLIKE + r")" + NAME
#: An INTEGER and an optional DECIMAL fraction, as two groups (the reader's token form).
NUMBER_GROUPS = r"(-?[1-9][0-9]*+|-?0(?=\.)|0)(\.[0-9]++)?"
#: A DECIMAL written out in full.
DECIMAL = r"-?(?:0|[1-9][0-9]*+)\.[0-9]++"
#: An INTEGER or a DECIMAL.
NUMBER = r"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?"
#: Whole-text matchers (use ``.match``; each is anchored at the end).
NAME_RE = re.compile(NAME + r"\Z")
SYMBOL_RE = re.compile(SYMBOL + r"\Z")
NUMBERLIKE_RE = re.compile(NUMBERLIKE)
DECIMAL_RE = re.compile(DECIMAL + r"\Z")
NUMBER_RE = re.compile(NUMBER + r"\Z")
URI_RE = re.compile(URI_PATTERN + r"\Z")

# --------------------------------------------------------------------------- kinds

#: The terminal names of the atom kinds, as grammars (and errors) name them.
STRING_KIND, INTEGER_KIND, DECIMAL_KIND = "STRING", "INTEGER", "DECIMAL"
SYMBOL_KIND, KEYWORD_KIND, URI_KIND = "SYMBOL", "KEYWORD", "URI"
ATOM_KINDS = (STRING_KIND, INTEGER_KIND, DECIMAL_KIND, KEYWORD_KIND, URI_KIND, SYMBOL_KIND)
#: Everything a ``value`` may start with.
VALUE_FIRST = ("LPAR", SYMBOL_KIND, STRING_KIND, INTEGER_KIND, DECIMAL_KIND, KEYWORD_KIND,
               URI_KIND)

# --------------------------------------------------------------------------- binary codes

#: Body token codes of the binary form (spec/binary.md); ``cbcl/_native_src/speedups.c`` has
#: the same enum. Codes from ``FIRST_ENTRY`` on name symbol-table entries.
CODE_LPAR, CODE_RPAR, CODE_INTEGER, CODE_DECIMAL, CODE_SYMBOL, CODE_KEYWORD, CODE_URI = range(7)
FIRST_ENTRY = 7
#: The kind of each code that is followed by the atom's text (or integer).
CODE_KINDS = {CODE_INTEGER: INTEGER_KIND, CODE_DECIMAL: DECIMAL_KIND,
              CODE_SYMBOL: SYMBOL_KIND, CODE_KEYWORD: KEYWORD_KIND, CODE_URI: URI_KIND}
