"""Jupyter display of an encoding (``_repr_html_``): the family protocol draws nothing itself;
``import posenc`` installs the picture through the hook in ``posenc.encodings.base``."""

from __future__ import annotations

import base64
import io
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.image import imread

import posenc
from posenc.encodings import base
from posenc.notebook import distance_figure_html


def _png(page: str) -> np.ndarray:
    start = page.index("data:image/png;base64,") + len("data:image/png;base64,")
    data = base64.b64decode(page[start : page.index("'", start)])
    return imread(io.BytesIO(data), format="png")


def test_an_encoding_shows_its_name_family_paper_and_picture() -> None:
    pe = posenc.build("alibi", num_heads=2)
    page = pe._repr_html_()
    assert page.startswith("<div><b>alibi</b> (bias) — Press et al. 2022")
    assert "<code>ALiBi(num_heads=2" in page
    image = _png(page)
    assert image.shape[0] > 100 and image.std() > 0.01  # a drawn figure, not a blank one


def test_an_unregistered_encoding_shows_its_class_name() -> None:
    class MySinusoidal(posenc.SinusoidalPositionalEncoding):
        paper = "mine"

    page = MySinusoidal(8, max_len=4)._repr_html_()
    assert page.startswith("<div><b>MySinusoidal</b> (additive) — mine<br>")
    assert "<img src='data:image/png;base64," in page


def test_an_encoding_that_cannot_be_drawn_says_why() -> None:
    page = posenc.build("alibi", num_heads=2).to("meta")._repr_html_()
    assert "<p>(no picture: " in page and "<img" not in page


def test_without_the_hook_the_text_remains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_html_figure", None)
    page = posenc.build("t5", num_heads=2)._repr_html_()
    assert page.startswith("<div><b>t5</b> (bias)") and page.endswith("</code></div>")
    calls = []
    base.set_html_figure(lambda pe, name: calls.append(name) or "<i>drawn</i>")
    assert posenc.build("none")._repr_html_().endswith("</code><i>drawn</i></div>")
    assert calls == ["none"]


def test_import_posenc_installs_the_picture_without_loading_matplotlib() -> None:
    code = (
        "import sys, posenc.encodings.base as b, posenc.notebook as n; "
        "assert b._html_figure is n.distance_figure_html; "
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert base._html_figure is distance_figure_html
