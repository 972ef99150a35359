"""What PostgreSQL cannot store: NUL characters and unpaired UTF-16 surrogates in text
and in jsonb strings, and NaN or infinite numbers in jsonb."""

import json
import re
from typing import Any

# A JSON escape of NUL that is not itself an escaped backslash followed by "u0000".
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_has_nul(json_text: str) -> bool:
    """Whether JSON text (as ``json.dumps`` writes it) holds a NUL, which jsonb refuses."""
    # The substring test first: it is much cheaper than the pattern, and almost always false.
    return "\\u0000" in json_text and _JSON_NUL.search(json_text) is not None


# Where an over-long diagnostic was cut: its head and its tail stay around this note.
_CUT_NOTE = "\n[… {} characters cut …]\n"


def diagnostic_text(text: str, max_chars: int) -> str:
    """``text`` as something PostgreSQL stores and a page can show, for diagnostics
    (error messages, tracebacks, event summaries, progress messages) that a handler
    writes and that nothing must refuse.

    NUL becomes U+FFFD and an unpaired surrogate ``?``. A text longer than
    ``max_chars`` keeps its first quarter and its last three quarters around a note of
    how many characters were cut, within ``max_chars`` in all: a traceback's last lines
    name the error, so its tail is worth more than its middle.
    """
    if len(text) > max_chars:
        # The note's length with the longest count it could hold, so the whole fits.
        keep = max(max_chars - len(_CUT_NOTE.format(len(text))), 0)
        head = keep // 4
        tail = keep - head
        note = _CUT_NOTE.format(len(text) - keep)
        text = f"{text[:head]}{note}{text[len(text) - tail :]}"[:max_chars]
    text = text.replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")


def text_problem(text: str) -> str | None:
    """Why PostgreSQL would refuse ``text`` as a text value, or None."""
    if "\x00" in text:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate, which is not valid UTF-8"
    return None


# json.dumps with any non-default option makes a new encoder at every call.
_encode = json.JSONEncoder(allow_nan=False).encode


def storable_json(value: Any) -> str:
    """``value`` as JSON text that jsonb accepts; ``ValueError`` saying why not."""
    try:
        text = _encode(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"is not JSON-serialisable: {error}") from None
    if json_has_nul(text):
        raise ValueError("contains a NUL character, which PostgreSQL cannot store")
    # json.dumps escapes every non-ASCII character; only text with a surrogate escape
    # can hold an unpaired one, so the costlier check runs only then.
    if "\\ud" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("contains an unpaired surrogate, which is not valid UTF-8") from None
    return text
