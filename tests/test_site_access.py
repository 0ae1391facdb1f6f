"""The static site as a learner who uses a screen reader, a keyboard, dark mode or a phone meets it, in Chromium.

* **axe-core** (from npm, read from a local file: ``make axe``; nothing is fetched while the test runs) on every
  page, against WCAG 2.0/2.1 A and AA: no serious or critical violation. Dark mode (the theme's ``data-theme``)
  is checked for contrast on a lesson, a quiz page and the home page.
* **The keyboard alone**: tabbing through a lesson page and a quiz page reaches every link of the article and
  every fold (``<summary>``), opening each fold with Enter to reach the links inside it.
* **Widths**: at 1280 px and at a phone's 390 px no page scrolls sideways (WCAG 1.4.10, Reflow), and a table wider
  than its column scrolls inside its own box instead of being cut off.
* **Figures**: every image says what it shows (its alt text is a description, not a path), and every figure of a
  run opens at full size on a click.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from labsession import CHROMIUM_FLAGS, browser_marks, chromium_path

REPO = Path(__file__).resolve().parents[1]
AXE = REPO / "build" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = [*browser_marks(pytest),
              pytest.mark.skipif(not AXE.exists(), reason="axe-core is not installed: `make axe` (needs npm)")]
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
# dark mode on one page of each kind: the home, lessons with panels, traces and quizzes, an exercise, a quiz page
DARK_PAGES = ("index.html", "notebooks/04_overlap.html", "notebooks/12_mixed_precision.html",
              "notebooks/14_sending_less.html", "exercises/02_ring_all_reduce.html", "quizzes/failures.html",
              "quizzes/index.html", "results.html", "gpu.html")
# resultTypes: only the violations are worked out in full (the passes are not needed: a quarter of the time)
RUN_AXE = """async (tags) => (await axe.run(document, {runOnly: {type: 'tag', values: tags},
                                                    resultTypes: ['violations']})).violations
  .map(v => ({id: v.id, impact: v.impact, where: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"""


@pytest.fixture(scope="module")
def site(offline_site):
    """The session's one build of the site (``tests/site_build.py``): its folder and its own pages."""
    assert offline_site.returncode == 0, offline_site.stdout[-3000:] + offline_site.stderr[-3000:]
    return offline_site.html, offline_site.pages()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def axe_violations(page, tags=WCAG_AA) -> list:
    page.add_script_tag(path=str(AXE))
    return page.evaluate(RUN_AXE, tags)


SIDEWAYS = "() => document.documentElement.scrollWidth > window.innerWidth + 1"
CLIPPED_TABLES = """() => [...document.querySelectorAll('article table')]
    .filter(t => { const box = t.parentElement; const r = t.getBoundingClientRect();
                   const b = box.getBoundingClientRect();
                   const scrolls = ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
                   return r.width > b.width + 1 && !scrolls; })
    .map(t => t.innerText.slice(0, 60))"""


def visit_every_page(site, browser, width: int, with_axe: bool) -> dict:
    """Open every page at ``width`` px: what scrolls sideways, which tables are cut off, and (``with_axe``)
    axe's serious and critical violations."""
    root, pages = site
    page = browser.new_page(viewport={"width": width, "height": 900})
    seen = {"sideways": [], "clipped": [], "violations": {}}
    for path in pages:
        page.goto(path.as_uri())
        if page.evaluate(SIDEWAYS):
            seen["sideways"].append(path.name)
        seen["clipped"] += [f"{path.name}: {t}" for t in page.evaluate(CLIPPED_TABLES)]
        for v in axe_violations(page) if with_axe else ():
            if v["impact"] in ("serious", "critical"):
                seen["violations"].setdefault(f"{v['id']} ({v['impact']})", []).append(
                    (path.relative_to(root).as_posix(), v["where"]))
    page.close()
    return seen


@pytest.fixture(scope="module")
def desktop(site, browser):
    """Every page opened once at a desktop's 1280 px, for both axe and the width check (one visit serves both)."""
    return visit_every_page(site, browser, 1280, with_axe=True)


def test_no_page_has_a_serious_or_critical_violation_light_or_dark(site, browser, desktop):
    root, pages = site
    found = dict(desktop["violations"])
    # dark mode as the theme's toggle leaves it (its choice in localStorage), set before the page loads: switched
    # on a loaded page, the colours would be measured halfway through the theme's transition
    dark = browser.new_context(color_scheme="dark", viewport={"width": 1280, "height": 900})
    dark.add_init_script("localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');")
    page = dark.new_page()
    for name in DARK_PAGES:
        page.goto((root / name).as_uri())
        assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
        for v in axe_violations(page, ["wcag2aa"]):
            if v["impact"] in ("serious", "critical"):
                found.setdefault(f"dark: {v['id']} ({v['impact']})", []).append((name, v["where"]))
    dark.close()
    assert len(pages) > 40
    assert not found, "\n".join(f"{rule}: {len(where)} page(s), e.g. {where[:2]}" for rule, where in found.items())


@pytest.mark.parametrize("name", ["notebooks/04_overlap.html", "quizzes/overlap.html"])
def test_the_keyboard_alone_reaches_every_link_and_fold_of_the_article(site, browser, name):
    root, _ = site
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto((root / name).as_uri())
    # what is there to reach: shown, and not hidden until hovered (the headings' # links are, by the theme's design)
    wanted = page.evaluate("""() => [...document.querySelectorAll('article a[href], article summary')]
        .filter(e => e.offsetParent !== null && getComputedStyle(e).visibility !== 'hidden')
        .map((e, i) => (e.dataset.k = String(i)))""")
    reached = set()
    for _ in range(len(wanted) + 400):  # the header and the sidebars come first
        page.keyboard.press("Tab")
        key, fold = page.evaluate("""() => { const e = document.activeElement;
            return [e && e.dataset.k, !!e && e.tagName === 'SUMMARY' && !e.parentElement.open]; }""")
        if key is not None:
            reached.add(key)
        if fold:  # a closed fold: open it with the keyboard, as a learner would, and go on into it
            page.keyboard.press("Enter")
        if len(reached) == len(wanted):
            break
    page.close()
    assert wanted and len(reached) == len(wanted), f"{name}: {len(wanted) - len(reached)} of {len(wanted)} not reached"


@pytest.mark.parametrize("width", [1280, 390])
def test_pages_fit_the_width_and_wide_tables_scroll_inside_their_box(site, browser, width, request):
    seen = request.getfixturevalue("desktop") if width == 1280 else visit_every_page(site, browser, width, False)
    assert not seen["sideways"], f"at {width} px these pages scroll sideways: {seen['sideways']}"
    assert not seen["clipped"], f"at {width} px these tables are cut off: {seen['clipped'][:5]}"


def test_every_image_says_what_it_shows_and_every_figure_opens_at_full_size(site):
    import html
    import re
    root, pages = site
    figures = 0
    for path in pages:
        text = path.read_text(encoding="utf-8")
        for tag in re.findall(r"<img\b[^>]*>", text):
            alt = re.search(r'\salt="([^"]*)"', tag)
            said = html.unescape(alt.group(1)).strip() if alt else ""
            assert len(said) > 20 and not re.search(r"_images/|\.(png|jpe?g|svg)$", said), (path.name, tag[:200])
        linked = re.findall(r'<a class="dpteach-figure" href="([^"]+)"[^>]*><img\b[^>]*src="([^"]+)"', text)
        assert all(href == src for href, src in linked)
        figures += len(linked)
    assert figures > 40  # the lessons' figures, each a link to itself
