"""Each figure's description as its image's alt text on the site.

A figure is stored with a description written from the figure itself (``dpteach/widgets/figure_text.py``), in its
output's metadata (``{"image/png": {"alt": ...}}``). MyST-NB writes every image output to ``_images/`` under the
SHA-256 of its bytes and gives the ``<img>`` its path as alt text (``myst_nb/core/render.py``, ``render_image``:
only width and height are taken from an output's metadata). So after Sphinx has written the pages
(``build.py``'s ``finish_pages``), this puts each description where a screen reader reads it: the ``alt`` of the ``<img>`` whose file is that image, and
wraps the image in a link to itself, so that a figure shrunk to the page's column opens at the size it was
drawn (its text then as large as the page's).
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

IMAGE = re.compile(r'<img\b[^>]*>')
SOURCE = re.compile(r'\bsrc="([^"]+)"')
ALT = re.compile(r'\salt="[^"]*"')


def alts_of(pages: Path) -> dict[str, str]:
    """``{"<sha256>.png": description}`` for every described image in the page sources under ``pages``."""
    alts = {}
    for path in pages.rglob("*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
            for output in cell.get("outputs", []):
                for mime, extension in (("image/png", ".png"), ("image/jpeg", ".jpeg")):
                    data = output.get("data", {}).get(mime)
                    said = output.get("metadata", {}).get(mime, {}).get("alt")
                    if data and said:
                        raw = base64.b64decode("".join(data) if isinstance(data, list) else data)
                        alts[hashlib.sha256(raw).hexdigest() + extension] = said
    return alts


def describe_images(text: str, alts: dict[str, str]) -> tuple[str, int]:
    """One page with every ``<img>`` whose file is in ``alts`` given that alt text and a link to its full-size
    image; returns the page and how many images were described."""
    given = []

    def replace(match) -> str:
        tag = match.group(0)
        source = SOURCE.search(tag)
        said = alts.get(source.group(1).rsplit("/", 1)[-1]) if source else None
        if said is None:
            return tag
        given.append(said)
        alt = f' alt="{html.escape(said, quote=True)}"'
        described = ALT.sub(lambda _: alt, tag, count=1) if ALT.search(tag) else tag.replace("<img", "<img" + alt, 1)
        # shrunk to the column, a figure's text is smaller than the page's: a click opens it at its own size
        return (f'<a class="dpteach-figure" href="{source.group(1)}" title="Open the figure at full size">'
                f'{described}</a>')

    page = IMAGE.sub(replace, text)
    return page, len(given)
