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


def without_nul(text: str) -> str:
    """``text`` with each NUL replaced by U+FFFD, for diagnostics such as tracebacks."""
    return text.replace("\x00", "\ufffd")


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
