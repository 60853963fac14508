"""Turn titles into URL slugs."""

import re


def slugify(title):
    """'Hello, World!' -> 'hello-world': the words of letters and digits, in lower case, joined by '-'."""
    words = re.findall(r"[A-Za-z0-9]+", title)
    return "-".join(words)
