"""Small sandbox helpers under upstream's names."""

from __future__ import annotations


def rewrite_image(image: str | None, rewrites: list[dict[str, str]]) -> str | None:
    """``image`` with the first rewrite whose ``from`` prefix it starts with applied (``from`` replaced by ``to``)."""
    if image is None:
        return None
    for rewrite in rewrites:
        if image.startswith(rewrite["from"]):
            return rewrite["to"] + image[len(rewrite["from"]):]
    return image
