"""A progress bar for a training run: step count, loss, one more metric, elapsed time, ETA."""

from __future__ import annotations

from typing import Any


class Bar:
    """A rich progress bar (loss, a metric, ETA) that does nothing when disabled.

    Args:
        enabled: draw the bar; when False only :meth:`log` prints (if a console is given).
        description: the text before the bar (which run this is).
        total: the number of steps.
        console: a ``rich.console.Console`` (default: one on stderr).
        start: steps already done (a resumed run).
        metric: the name of the second number shown after the loss.
        loss_unit: what the loss is measured in, shown after it (both trainers report the mean
            cross-entropy per scored token, in nats).

    Before the first step of a run (or of a resumed run) the loss and the metric show a dash,
    not a number.
    """

    #: Shown in place of a number not measured yet.
    NOT_YET = "—"

    def __init__(
        self,
        enabled: bool,
        description: str,
        total: int,
        console: Any,
        *,
        start: int,
        metric: str = "acc",
        loss_unit: str = "nats/token",
    ) -> None:
        self.enabled = enabled
        self.progress: Any = None
        self.console = console  # log lines still go here when the bar is off
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"loss {{task.fields[loss]}} {loss_unit}  {metric} {{task.fields[metric]}}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task_id = self.progress.add_task(
            description, total=total, completed=start, loss=self.NOT_YET, metric=self.NOT_YET
        )

    def __enter__(self) -> Bar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, metric: float) -> None:
        if self.progress is not None:
            self.progress.update(
                self.task_id, completed=step, loss=f"{loss:.4f}", metric=f"{metric:.3f}"
            )

    def log(self, text: str) -> None:
        """Print a line above the bar (or on the console when the bar is off)."""
        console = self.progress.console if self.progress is not None else self.console
        if console is not None:
            console.log(text)
