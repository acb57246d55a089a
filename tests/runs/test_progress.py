"""posenc.runs.progress: the progress bar shows loss and metric, no number before the first
step, and logs lines whether it is shown or not.
"""

from __future__ import annotations

import io

from rich.console import Console

from posenc.runs.progress import Bar


def test_progress_bar_shows_loss_and_metric_and_logs() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    with Bar(True, "toy run", 4, console, start=1, metric="acc") as bar:
        bar.update(2, 0.5, 0.25)
        bar.log("a line")
    text = out.getvalue()
    assert "toy run" in text and "a line" in text
    assert "loss 0.5000 nats/token  acc 0.250" in text and "nan" not in text


def test_progress_bar_shows_no_number_before_the_first_step() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    with Bar(True, "resumed run", 4, console, start=2):
        pass
    text = out.getvalue()
    assert "nan" not in text and f"loss {Bar.NOT_YET} nats/token  acc {Bar.NOT_YET}" in text
    quiet = io.StringIO()
    Bar(False, "off", 4, Console(file=quiet), start=0).log("still logged")
    assert "still logged" in quiet.getvalue()
