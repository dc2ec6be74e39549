"""The inspector page's static files: nothing from elsewhere, no markup from data.

The browser test (tests/web) shows what the page does; these checks keep two
promises that a browser on a connected machine would not notice being broken: the
page loads nothing from another origin, and no value is ever parsed as HTML.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

STATIC = Path(__file__).resolve().parents[2] / "processor" / "web" / "static"
#: The routes of the plan's HTTP API that the page may read.
API_ROUTES = {"api/runs", "api/runs/{}", "api/runs/{}/history", "api/runs/{}/graph"}
API_ROUTES |= {"api/requests"}
API_ROUTES |= {"api/rejected", "api/dlq"}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [v for k, v in attrs if k in {"src", "href", "action"} and v is not None]


def _page_links() -> list[str]:
    parser = _Links()
    parser.feed((STATIC / "index.html").read_text())
    return parser.links


def test_the_page_loads_its_script_and_style_from_its_own_server() -> None:
    links = _page_links()
    assert "static/app.js" in links
    assert "static/style.css" in links
    off_origin = [link for link in links if re.match(r"^([a-z][a-z0-9+.-]*:|//)", link)]
    assert off_origin == ["data:,"], off_origin  # the empty favicon only


def test_no_file_names_another_origin() -> None:
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"https?://|url\(\s*['\"]?//", text), path.name


def test_the_script_never_parses_data_as_html() -> None:
    script = (STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink


def test_the_script_reads_only_routes_of_the_api() -> None:
    script = (STATIC / "app.js").read_text()
    used = {
        re.sub(r"\$\{[^}]*\}", "{}", path)
        for path in re.findall(r"api\(\s*[`\"](api/[^`\"?]*)[`\"]", script)
    }
    used |= {
        re.sub(r"\$\{[^}]*\}", "{}", path)
        for path in re.findall(r"refreshTopic\([^,]+,\s*\"(api/[^\"]+)\"", script)
    }
    assert used, "no API call found: the pattern no longer matches the script"
    assert used <= API_ROUTES, used - API_ROUTES
    assert "POST" not in script  # the page only reads
