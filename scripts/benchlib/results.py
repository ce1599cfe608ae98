"""The one result format of every benchmark: a JSON line per measurement on stdout, a readable table at the end.

Each line is ``{"benchmark", "params", "metric", "value", "unit", "revision"}``: ``params`` what the figure depends
on (sizes, the variant, the round), ``revision`` the commit of the code measured (a checkout's HEAD, or the revision
a tree was made from). Progress and notes go to stderr (scripts/bench.py sends ``print`` there), so
``scripts/bench.py ... > results.jsonl`` keeps only measurements.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def revision(tree: str | Path = REPO) -> str:
    """The short commit of a checkout (a git worktree or a tree made by harness.tree, which records it)."""
    marker = Path(tree) / ".bench-revision"
    if marker.is_file():
        return marker.read_text().strip()
    run = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else "unknown"


@dataclass
class Results:
    """Writes each measurement as it is made; ``table()`` shows them all once the benchmark is done."""

    benchmark: str
    revision: str = field(default_factory=revision)
    out: object = field(default_factory=lambda: sys.__stdout__)
    rows: list[dict] = field(default_factory=list)

    def add(self, metric: str, value: float | int | str, unit: str = "", revision: str | None = None,
            **params) -> None:
        row = {"benchmark": self.benchmark, "params": params, "metric": metric, "value": value, "unit": unit,
               "revision": revision or self.revision}
        self.rows.append(row)
        print(json.dumps(row, default=str), file=self.out, flush=True)

    def add_all(self, figures: dict[str, tuple[float | int | str, str]], revision: str | None = None,
                **params) -> None:
        """Several metrics of one run: ``{metric: (value, unit)}``."""
        for metric, (value, unit) in figures.items():
            self.add(metric, value, unit, revision, **params)

    def table(self) -> str:
        """Every measurement, one a line: revision, parameters, metric, value and unit in columns."""
        if not self.rows:
            return f"{self.benchmark}: no measurements"
        lines = [(row["revision"], " ".join(f"{k}={v}" for k, v in row["params"].items()), row["metric"],
                  _shown(row["value"]), row["unit"]) for row in self.rows]
        header = ("revision", "params", "metric", "value", "unit")
        widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
        return "\n".join("  ".join(str(cell).rjust(w) if i == 3 else str(cell).ljust(w)
                                   for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
                         for line in [header, *lines])


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
