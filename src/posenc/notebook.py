"""Notebook display: an encoding's ``_repr_html_`` shows its logit contribution against
distance.

The family protocol (:mod:`posenc.encodings.base`) draws nothing itself, so the ground floor
of the package never imports the pictures; this module, which ``import posenc`` loads, hands
it the picture. matplotlib is imported only when a notebook first shows an encoding.
"""

from __future__ import annotations

import html

from .encodings.base import PositionalEncoding, set_html_figure


def distance_figure_html(pe: PositionalEncoding, name: str) -> str:
    """An ``<img>`` of :func:`posenc.plots.diagnostics.distance` for ``pe`` over 48 positions,
    inline as a PNG ``data:`` URI; a line saying why when it cannot be drawn (e.g. an encoding
    on the ``meta`` device)."""
    from .plots import figure_to_data_uri
    from .plots.diagnostics import distance

    try:
        uri = figure_to_data_uri(distance(pe, name, 48))
    except (ValueError, TypeError, RuntimeError) as exc:
        return f"<p>(no picture: {html.escape(str(exc))})</p>"
    return f"<img src='{uri}' width='480'>"


set_html_figure(distance_figure_html)
