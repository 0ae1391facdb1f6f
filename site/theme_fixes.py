"""What the theme's HTML lacks for WCAG 2.1 AA, given after Sphinx has written the pages.

The site's theme (sphinx-book-theme on pydata-sphinx-theme) builds its sidebar's section toggles in Python
(``pydata_sphinx_theme/toctree.py``): a ``<details>`` whose ``<summary>`` holds only a chevron icon marked
``role="presentation"``. A screen reader announces it as an unnamed control (axe: ``summary-name``, serious;
WCAG 4.1.2, Name, Role, Value). No option of the theme names it, and the markup is not a template, so each such
summary is given an ``aria-label`` naming the section it opens, read from the link just before it. The search
button, which *is* a template, is overridden instead (``_templates/search-button-field.html``).
"""
from __future__ import annotations

import html
import re

UNNAMED_TOGGLE = re.compile(r'(<a\b[^>]*>(?P<name>[^<]*)</a>\s*<details\b[^>]*>\s*)<summary>'
                            r'(?=\s*<span class="toctree-toggle")')


def name_toggles(text: str) -> tuple[str, int]:
    """Every sidebar toggle named after its section; returns the page and how many were named."""
    def named(match) -> str:
        section = html.unescape(match.group("name")).strip() or "this section"
        name = html.escape(f"Show or hide the pages of {section}", quote=True)
        return f'{match.group(1)}<summary aria-label="{name}">'
    return UNNAMED_TOGGLE.subn(named, text)
