"""The HTML report, opened in a real headless Chromium: every image decodes, nothing is
requested from the network, nothing is logged as an error, and it fits a phone's width."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from posenc.app.cli import main
from posenc.app.report import build_report, markdown_to_html
from tests.misuse import Misuse, check

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, which the set-up installs (README, `.ci/run`); the tests never
    install anything themselves."""
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(
            "Debian's chromium is not installed: run `apt-get update && apt-get install -y "
            "chromium` (as root; .ci/run does) to run the browser tests"
        )
    return path


@pytest.fixture(scope="session")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    results = root / "results"
    results.mkdir()
    (results / "speed.md").write_text(
        "# Speed\n\n| op | ratio |\n| --- | --- |\n| copy | 1.00 |\n\n"
        "[elsewhere](https://example.org) ![remote](https://example.org/x.png)\n"
    )
    page = root / "report.html"
    assert (
        main(["report", "sinusoidal", "alibi", "rope", "--results", str(results), "-o", str(page)])
        == 0
    )
    return page


def test_report_is_self_contained(report: Path) -> None:
    text = report.read_text()
    assert "http://" not in text and "https://" not in text
    assert text.count("<img") >= 8
    assert "Measured properties" in text and "Speed" in text and "<table" in text


def test_markdown_links_and_remote_images_are_dropped() -> None:
    out = markdown_to_html(
        "see [a](https://x.org) ![b](http://x.org/i.png) ![c](data:image/png;base64,AA)"
    )
    assert "x.org" not in out and "data:image/png" in out


def test_unknown_name_fails_first() -> None:
    check(Misuse("unknown", lambda: build_report(["sinusoidal", "nope"]), ValueError,
                 "positional encoding", "nope"))  # fmt: skip


@pytest.mark.slow
def test_report_in_chromium(report: Path, chromium: str, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    requests: list[str] = []
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        for width, height in ((1280, 900), (390, 844)):  # a laptop and a phone
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(report.as_uri(), wait_until="load")
            images = page.evaluate(
                "Array.from(document.images)"
                ".map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
            )
            assert len(images) >= 8
            assert all(done and w > 100 and h > 100 for done, w, h in images), images
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, f"page is {overflow}px wider than a {width}px screen"
            shot = tmp_path / f"report-{width}.png"
            page.screenshot(path=str(shot), full_page=width < 1000)
            if os.environ.get("POSENC_UPDATE_DOCS"):  # refresh the picture the docs show
                shutil.copy(shot, Path(__file__).parents[2] / "docs" / shot.name)
            page.close()
        browser.close()
    external = [u for u in requests if not u.startswith(("data:", "file:"))]
    assert external == []
    assert errors == []
    assert (tmp_path / "report-1280.png").stat().st_size > 10_000
