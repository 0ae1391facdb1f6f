"""Sphinx configuration of the course's website; build it with ``python site/build.py`` (``make site``).

The page sources are written by build.py (into site/_pages, or wherever --pages says); this file is found
with ``sphinx-build -c site``. Offline by construction: notebooks are never executed here (their outputs
come from the stored runs in site/outputs), no intersphinx, no widget JavaScript from a CDN.
"""
project = "dpteach"
author = "the dpteach authors"
copyright = "the dpteach authors"
html_title = "dpteach: data-parallel training, taught by running it"

extensions = ["myst_nb"]
nb_execution_mode = "off"       # outputs come from site/outputs (stored runs), never from running here
nb_ipywidgets_js = {}           # the pages carry no widget state; load no widget manager from a CDN
nb_merge_streams = True         # consecutive prints of a cell in one block
nb_output_stderr = "show"
myst_heading_anchors = 4        # lessons link to each other's sections
myst_enable_extensions = ["colon_fence"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
suppress_warnings = ["myst.header"]  # lessons may step from a ## section to a #### note

html_theme = "sphinx_book_theme"
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
}
templates_path = ["_templates"]  # one theme component with an accessible name (theme_fixes.py says why)
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_show_sourcelink = False
html_last_updated_fmt = None
