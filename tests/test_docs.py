"""The documentation site builds strictly, fails on what would make it wrong, and its quickstart renders.

``mkdocs build --strict`` (mkdocs.yml: every link and anchor validated, every page in the navigation)
runs as ``make docs`` does; the reference pages come from the code in that build (docs/hooks.py,
docs/gen_reference.py).  Each failure mode is then shown to stop a build: a broken link, a broken
anchor, a reference page the generator no longer makes, and the generator's own refusals (a variable
the source reads that no table describes, a row for one it no longer reads, a command without exit
codes or with a code its module names and the table lacks, an event missing from the schema, a public API
member without a docstring).  Last, the built
quickstart is opened in headless Chromium (Debian's package, which scripts/bootstrap.sh installs):
its architecture picture must be in the page and loaded, and a screenshot is kept in the test's tmp dir.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402

# Material prints a banner about MkDocs 2.0 on every build; it is no warning of ours.
QUIET = {"NO_MKDOCS_2_WARNING": "1"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as ``make docs`` builds it, into a tmp dir."""
    out = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **QUIET})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-6000:]
    return out


def test_the_site_has_every_page_and_the_generated_reference(site):
    assert (site / "index.html").is_file()
    for page in ("quickstart", "concepts", "training-loop", "requirements", "troubleshooting", "failures",
                 "benchmarks", "howto/bare-metal", "howto/gpu", *[p.removesuffix(".md") for p in gen_reference.PAGES]):
        assert (site / page / "index.html").is_file(), page
    environment = (site / "reference" / "environment" / "index.html").read_text()
    for name in gen_reference.variables_in_source():
        assert name in environment, name
    # The pages that include repository files as they stand include them.
    assert "Join-ahead" in (site / "benchmarks" / "index.html").read_text()
    loop_page = re.sub(r"<[^>]+>", "", (site / "training-loop" / "index.html").read_text())
    assert "The smallest correct elastic training script" in loop_page and "def main()" in loop_page
    assert (site / "img" / "architecture.svg").is_file() and (site / "demo-report.png").is_file()


# ----------------------------------------------------------------------------------- what must fail a build

@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return gen_reference.pages()


def build_in_process(tmp_path: Path, monkeypatch, pages: dict[str, str]) -> None:
    """mkdocs.yml's strict build, in this process, with the generator handing over ``pages``."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.setattr(gen_reference, "pages", lambda: dict(pages))
    monkeypatch.chdir(REPO)
    for name, value in QUIET.items():
        monkeypatch.setenv(name, value)
    build(load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site")))


def test_the_same_build_in_process_passes(tmp_path, monkeypatch, generated):
    build_in_process(tmp_path, monkeypatch, generated)  # the failures below are the changes' alone


@pytest.mark.parametrize("change, expected", [
    ("link", "contains a link 'no-such-page.md', but the target 'reference/no-such-page.md' is not found"),
    ("anchor", "does not contain an anchor '#no-such-heading'"),
    ("missing page", "reference/metrics.md"),
])
def test_a_broken_link_anchor_or_missing_page_fails_the_build(tmp_path, monkeypatch, caplog, generated, change,
                                                             expected):
    from mkdocs.exceptions import Abort

    pages = dict(generated)
    if change == "link":
        pages["reference/cli.md"] += "\n[a page that is not there](no-such-page.md)\n"
    elif change == "anchor":
        pages["reference/cli.md"] += "\n[a heading that is not there](../quickstart.md#no-such-heading)\n"
    else:
        del pages["reference/metrics.md"]
    with pytest.raises(Abort, match="strict mode"):
        build_in_process(tmp_path, monkeypatch, pages)
    assert expected in caplog.text


def test_a_generator_refusal_fails_the_build(tmp_path, monkeypatch, caplog):
    from mkdocs.exceptions import Abort

    def refuse():
        raise gen_reference.ReferenceError("hvd_elastic/ reads HVD_ELASTIC_NEW, which ... add a row")

    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.setattr(gen_reference, "pages", refuse)
    monkeypatch.chdir(REPO)
    # mkdocs logs a plugin's error and aborts the build (the command line exits 1, "Aborted with a BuildError!").
    with pytest.raises(Abort, match="BuildError"):
        build(load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site")))
    assert "docs/gen_reference.py: hvd_elastic/ reads HVD_ELASTIC_NEW" in caplog.text


def test_the_generator_refuses_a_variable_without_a_description(monkeypatch):
    scanned = gen_reference.variables_in_source()
    monkeypatch.setattr(gen_reference, "variables_in_source",
                        lambda: {**scanned, "HVD_ELASTIC_NOT_DESCRIBED": ["hvd_elastic.somewhere"]})
    with gen_reference.clean_environment(), pytest.raises(gen_reference.ReferenceError,
                                                          match="HVD_ELASTIC_NOT_DESCRIBED"):
        gen_reference.environment_page()


def test_the_generator_refuses_a_row_for_a_variable_the_source_no_longer_reads(monkeypatch):
    monkeypatch.setitem(gen_reference.VARIABLES, "HVD_ELASTIC_GONE", "no longer read anywhere")
    with gen_reference.clean_environment(), pytest.raises(gen_reference.ReferenceError, match="HVD_ELASTIC_GONE"):
        gen_reference.environment_page()


def test_the_generator_refuses_a_command_without_exit_codes(monkeypatch):
    monkeypatch.delitem(gen_reference.EXIT_CODES, "drain")
    with pytest.raises(gen_reference.ReferenceError, match="no row for drain"):
        gen_reference.exit_codes_page()


def test_the_generator_refuses_an_exit_code_the_table_does_not_list(monkeypatch):
    rows = [row for row in gen_reference.EXIT_CODES["drain"] if row[0] != "3"]
    monkeypatch.setitem(gen_reference.EXIT_CODES, "drain", rows)
    with pytest.raises(gen_reference.ReferenceError, match="drain's code speaks of exit 3"):
        gen_reference.exit_codes_page()


def test_the_generator_refuses_an_event_the_schema_table_misses(monkeypatch):
    from hvd_elastic.training import events

    monkeypatch.setattr(events, "EVENTS", (*events.EVENTS, "new_event"))
    with pytest.raises(gen_reference.ReferenceError, match="new_event"):
        gen_reference.events_page()


def test_the_generator_refuses_an_undocumented_public_member(monkeypatch):
    from hvd_elastic import BatchPolicy

    monkeypatch.setattr(BatchPolicy.constant_global.__func__, "__doc__", None)
    with pytest.raises(gen_reference.ReferenceError, match="BatchPolicy.constant_global"):
        gen_reference.api_page()


def test_every_generated_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    for path in gen_reference.PAGES:
        assert re.search(rf":\s*{re.escape(path)}\s*$", nav, re.M), f"mkdocs.yml's nav does not list {path}"
        assert not (DOCS / path).exists(), f"docs/{path} is generated: it must not be committed"


# ----------------------------------------------------------------------------------- the page in a browser

CHECK_PAGE = """<!doctype html>
<html><body><pre id="result">pending</pre>
<iframe id="page" src="/quickstart/" width="1280" height="2400"></iframe>
<script>
document.getElementById("page").addEventListener("load", () => {
  const doc = document.getElementById("page").contentDocument;
  const images = [...doc.querySelectorAll("article img")].map(img => {
    const box = img.getBoundingClientRect();
    return {src: img.getAttribute("src"), complete: img.complete, naturalWidth: img.naturalWidth,
            naturalHeight: img.naturalHeight, shownWidth: box.width, shownHeight: box.height};
  });
  const h1 = doc.querySelector("article h1");
  document.getElementById("result").textContent = JSON.stringify(
      {title: doc.title, h1: h1 ? h1.textContent : null, images: images});
});
</script></body></html>
"""


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on loopback (as a reader's browser would get it)."""
    (site / "_render_check.html").write_text(CHECK_PAGE)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("no chromium on PATH (Debian's package; scripts/bootstrap.sh installs it)")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=90)


def test_the_quickstart_renders_with_its_picture(served, tmp_path):
    dom = chromium(tmp_path, "--virtual-time-budget=15000", "--dump-dom", f"{served}/_render_check.html")
    found = re.search(r'<pre id="result">(.*?)</pre>', dom.stdout, re.S)
    assert found and found.group(1) != "pending", dom.stdout[-2000:] + dom.stderr[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                        .replace("&gt;", ">"))
    assert result["h1"] and result["h1"].startswith("Quickstart"), result
    (picture,) = [img for img in result["images"] if img["src"].endswith("img/architecture.svg")]
    assert picture["complete"] and picture["naturalWidth"] > 0 and picture["naturalHeight"] > 0, picture
    assert picture["shownWidth"] > 300 and picture["shownHeight"] > 150, picture

    screenshot = tmp_path / "quickstart.png"
    shot = chromium(tmp_path, "--window-size=1280,1600", f"--screenshot={screenshot}", f"{served}/quickstart/")
    assert shot.returncode == 0 and screenshot.is_file(), shot.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(str(screenshot))
    assert pixels.shape[:2] == (1600, 1280), pixels.shape
    colours = {tuple(p) for p in (pixels[::8, ::8, :3] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(colours) > 50, f"the screenshot is nearly blank: {len(colours)} colours ({screenshot})"
    print(f"screenshot of the quickstart page: {screenshot}")
