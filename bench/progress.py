"""A `rich` progress bar for a bench's long loads, on stderr (the figures on stdout stay clean) and
gone once the load is done."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextlib.contextmanager
def loading(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)` (safe from several threads) while the bar shows `total` items loading."""
    with Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.update(task, advance=n)
