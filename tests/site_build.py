"""The course's website built once per test session, as a newcomer's machine builds it: offline and strict.

``site/build.py`` runs with the network made unusable - proxies pointed at a dead port, and an audit hook in every
Python process of the build (a ``sitecustomize`` on ``PYTHONPATH``) that records any attempt to resolve a host
name or open a socket to another machine - and Sphinx's warnings as errors. ``tests/test_site.py`` reads the pages
and the network log; ``tests/test_site_access.py`` opens the same pages in Chromium. (Built twice, the site cost
the suite its build time twice for the same pages.)
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NETWORK_WATCH = '''
import os, sys
_LOG = os.environ["DPTEACH_SITE_NETLOG"]
_LOCAL = ("localhost", "127.0.0.1", "::1", "", None)

def _watch(event, args):
    if event == "socket.getaddrinfo" and args[0] not in _LOCAL:
        host = args[0]
    elif event == "socket.connect" and isinstance(args[1], tuple) and args[1] and args[1][0] not in _LOCAL:
        host = args[1][0]
    elif event == "urllib.Request":
        host = args[0]
    else:
        return
    with open(_LOG, "a") as log:
        log.write(f"{os.getpid()} {event} {host}\\n")

sys.addaudithook(_watch)
with open(_LOG + ".watched", "a") as watched:  # proof that this process was watched
    watched.write(f"{os.getpid()} {' '.join(sys.orig_argv)[:200]}\\n")
'''


@dataclass
class OfflineSite:
    html: Path            # the built pages
    returncode: int
    stdout: str
    stderr: str
    reached: str          # what the build tried to reach on other machines (empty: nothing)
    watched: list[str]    # the processes the audit hook watched
    seconds: float

    def pages(self) -> list[Path]:
        """The site's own pages (not the theme's search and index pages)."""
        return sorted(p for p in self.html.rglob("*.html") if "_static" not in p.parts
                      and p.name not in ("search.html", "genindex.html"))


def build_offline(base: Path) -> OfflineSite:
    watch = base / "watch"
    watch.mkdir(parents=True, exist_ok=True)
    (watch / "sitecustomize.py").write_text(NETWORK_WATCH)
    netlog = base / "network.log"
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    path = os.pathsep.join([str(watch), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path,
           "DPTEACH_SITE_NETLOG": str(netlog), "http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead,
           "HTTPS_PROXY": dead, "all_proxy": dead, "ALL_PROXY": dead, "no_proxy": "", "NO_PROXY": ""}
    out = base / "html"
    started = time.monotonic()
    command = [sys.executable, str(REPO / "site" / "build.py"), "--pages", str(base / "pages"), "--out", str(out),
               "--strict"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540)
    watched = Path(f"{netlog}.watched")
    return OfflineSite(out, done.returncode, done.stdout, done.stderr,
                       netlog.read_text() if netlog.exists() else "",
                       watched.read_text().splitlines() if watched.exists() else [], time.monotonic() - started)
