"""Progress of long commands: a rich progress bar on a terminal, plain lines when the output is piped."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console

from trtllm_replayssm.lab.compare import ProgressEvent

LINE_INTERVAL_S = 2.0  # piped output: at most one step line per this many seconds


@contextlib.contextmanager
def compare_progress(console: Console) -> Iterator[Callable[[ProgressEvent], None]]:
    """A ``compare`` progress callback: per model, per batch and per decode step."""
    if console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("loading", total=None)

            def show(ev: ProgressEvent) -> None:
                if ev.phase == "load":
                    bar.update(task, description=f"{ev.model}: loading", completed=0, total=None)
                    return
                label = f"{ev.model} batch {ev.batch} ({ev.batch_index + 1}/{ev.batches}) {ev.impl} {ev.phase}"
                bar.update(task, description=label, completed=ev.impl_index * ev.steps + ev.done,
                           total=ev.impls * ev.steps)

            yield show
        return

    last = [0.0]

    def echo(ev: ProgressEvent) -> None:
        now = time.monotonic()
        where = f"{ev.model} batch {ev.batch} ({ev.batch_index + 1}/{ev.batches})"
        if ev.phase == "load":
            line = f"{ev.model}: loading"
        elif ev.phase == "batch done":
            line = f"{where}: done"
        elif ev.phase == "decode" and ev.done == 1:
            line = f"{where} {ev.impl}: decoding {ev.steps} steps"
        elif ev.phase == "decode" and now - last[0] >= LINE_INTERVAL_S:
            line = f"  {ev.impl} step {ev.done}/{ev.steps}"
        else:
            return
        console.print(line, markup=False, highlight=False)
        last[0] = now

    yield echo
