"""The one error type for bad input: it lists every problem, one line each."""

from __future__ import annotations

from ..errors import UserError

__all__ = ["ConfigError"]


class ConfigError(UserError, ValueError):
    """Raised with every problem found, each naming the field, the bad value and the fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0]
        lines = [f"{len(self.problems)} problems in the config:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)
