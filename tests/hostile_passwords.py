"""Passwords of any printable characters, and every way a user may write one into a ``postgresql://``
location, for the tests that no output of the project shows one."""

from __future__ import annotations

import re
from urllib.parse import quote

from hypothesis import strategies as st

# Framed by letters that no output holds around it, so that a short password is not found by chance.
PASSWORDS = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=4).map(lambda text: f"Q{text}q")


def libpq_raw(password: str) -> str:
    """``password`` written raw where libpq takes it raw in a location's user part: all but ``%``, ``@`` and ``/``."""
    return password.replace("%", "%25").replace("@", "%40").replace("/", "%2F")


def written_forms(password: str, where: str = "127.0.0.1:1") -> list[str]:
    """``password`` in a location of the database ``gym`` at ``where``: percent-encoded, raw where libpq takes
    it raw, raw whatever it holds, and as a parameter."""
    return [
        f"postgresql://gym:{quote(password, safe='')}@{where}/gym",
        f"postgresql://gym:{libpq_raw(password)}@{where}/gym?sslmode=disable",
        f"postgresql://gym:{password}@{where}/gym",
        f"postgresql://gym@{where}/gym?password={password.replace('%', '%25').replace('&', '%26')}",
    ]


def leaked(password: str, text: str) -> bool:
    """Whether ``text`` holds ``password``, as it is or percent-encoded."""
    return any(form in text for form in (password, quote(password, safe="")))


def pieces_shown(password: str, text: str) -> list[str]:
    """The runs of letters and digits of ``password`` (four or more) that ``text`` holds: a password shown
    cut up or mangled (a ``?`` taken for a query, say) still shows those."""
    return [piece for piece in re.split(r"[^A-Za-z0-9]+", password) if len(piece) >= 4 and piece in text]
