"""The API reference (issue T3-5 item 5; docs/api.md): pdoc renders the public modules'
docstrings (the Makefile's ``API_MODULES``, what ``make api`` builds), every link in the pages
resolves, every public name of ``stanvi`` has its entry, and ``dir(stanvi)`` shows the public
names only."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag

import pytest

import stanvi

ROOT = Path(__file__).resolve().parents[1]


def api_modules() -> list[str]:
    """The Makefile's ``API_MODULES`` (continuation lines joined)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^API_MODULES := (.+)$", text, re.M)
    assert match, "the Makefile defines API_MODULES"
    return match.group(1).split()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "href" and value:
                self.hrefs.append(value)
            if name == "id" and value:
                self.ids.add(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text())
    return parser


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("api")
    proc = subprocess.run([sys.executable, "-m", "pdoc", "--docformat", "google",
                           "--output-directory", str(out), *api_modules()],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_every_link_of_the_reference_resolves(api):
    pages = sorted(api.rglob("*.html"))
    assert len(pages) >= len(api_modules())
    parsed = {page: _parse(page) for page in pages}
    broken = []
    for page in pages:
        links = parsed[page]
        for href in links.hrefs:
            if href.startswith(("http://", "https://", "mailto:", "javascript:")):
                continue
            target, anchor = urldefrag(href)
            file = (page.parent / target).resolve() if target else page
            if file.is_dir():
                file = file / "index.html"
            if not file.is_file():
                broken.append(f"{page.relative_to(api)}: {href} (no file)")
            elif anchor and file.suffix == ".html":
                if file not in parsed:
                    parsed[file] = _parse(file)
                if anchor not in parsed[file].ids:
                    broken.append(f"{page.relative_to(api)}: {href} (no #{anchor})")
    assert not broken, "\n".join(broken[:20])


def test_every_public_name_has_its_entry(api):
    ids = _parse(api / "stanvi.html").ids
    missing = [name for name in stanvi.__all__ if name != "__version__" and name not in ids]
    assert not missing, missing
    for module in api_modules():
        assert (api / (module.replace(".", "/") + ".html")).is_file(), module


def test_dir_of_the_package_shows_public_names_only():
    shown = {name for name in dir(stanvi) if not name.startswith("__")}
    assert {"os", "Path", "compile_model", "atexit", "annotations"}.isdisjoint(shown)
    assert set(stanvi.__all__) - {"__version__"} <= shown
    assert shown - set(stanvi.__all__) <= set(stanvi._PUBLIC_PACKAGES)
