"""What PostgreSQL cannot store: the NUL character, in text and in jsonb strings."""

import re

# A JSON escape of NUL that is not itself an escaped backslash followed by "u0000".
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def json_has_nul(json_text: str) -> bool:
    """Whether JSON text (as ``json.dumps`` writes it) holds a NUL, which jsonb refuses."""
    return _JSON_NUL.search(json_text) is not None


def without_nul(text: str) -> str:
    """``text`` with each NUL replaced by U+FFFD, for diagnostics such as tracebacks."""
    return text.replace("\x00", "\ufffd")
