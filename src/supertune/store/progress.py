"""Progress of `supertune prepare`: a tqdm bar on a terminal, a plain line every few seconds in a job log."""

from __future__ import annotations

import sys
import time

__all__ = ["Progress"]

# A job log gets a line this often: enough to see a task is alive and how fast it goes, few enough
# lines that a day-long task's log stays readable.
LOG_SECONDS = 30.0


class Progress:
    """Rows and tokens of one split so far; a bar when stderr is a terminal, else log lines."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name, self.total = name, total
        self.rows = self.tokens = 0
        self.started = self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=f"prepare {name}", unit=" rows", dynamic_ncols=True)

    def update(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(rows)
            self.bar.set_postfix_str(f"{self.tokens:,} tokens", refresh=False)
            return
        now = time.monotonic()
        if now - self.last >= LOG_SECONDS:
            self.last = now
            self._line(now)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self._line(time.monotonic())

    def _line(self, now: float) -> None:
        of = f"/{self.total:,}" if self.total is not None else ""
        seconds = now - self.started
        rate = self.tokens / seconds if seconds > 0 else 0.0
        print(
            f"supertune: prepare {self.name}: {self.rows:,}{of} rows, {self.tokens:,} tokens ({rate:,.0f} tokens/s)",
            file=sys.stderr,
            flush=True,
        )
