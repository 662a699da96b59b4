"""The results: one table (rich on the terminal, Markdown in .scratch) and the target lines.

A target line is the one-line form of a figure with a target, printed exactly as
``<prefix> <name>: <value> (target <= <x>)`` (or ``>=``), the value a plain number.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime


def plain(value: float, digits: int = 3) -> str:
    """A plain decimal number (never scientific): 3 decimals from 1 up, 3 significant digits below."""
    if value is None or not math.isfinite(value):
        return str(value)
    if value == 0 or abs(value) >= 1:
        return f"{value:.{digits}f}"
    places = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{places}f}"


def target_line(prefix: str, name: str, value: float, op: str, target: float) -> str:
    return f"{prefix} {name}: {plain(value)} (target {op} {target:g})"


def meets(value: float, op: str, target: float) -> bool:
    return value <= target if op == "<=" else value >= target


@dataclass
class Row:
    figure: str
    measured: str
    baseline: str
    ratio: float | None
    target: str
    #: True / False against the target; None: informational, not available, or not measured.
    passed: bool | None
    notes: list[str] = field(default_factory=list)
    #: Target lines of this row (printed beside the table).
    lines: list[str] = field(default_factory=list)
    status: str | None = None  # overrides the pass/fail text ("n/a", "error")

    @property
    def ratio_text(self) -> str:
        return "-" if self.ratio is None else plain(self.ratio)

    @property
    def verdict(self) -> str:
        if self.status:
            return self.status
        if self.passed is None:
            return "info"
        return "pass" if self.passed else "MISS"


def target_row(prefix: str, name: str, value: float, op: str, target: float, measured: str, baseline: str,
               figure: str | None = None, ok: bool = True) -> Row:
    """A row whose ratio is ``value`` against ``op target``, with its target line. ``ok`` False:
    the run itself went wrong (a job lost, not finished), so the target is missed whatever the value."""
    return Row(figure or f"{prefix} {name}", measured, baseline, value, f"{op} {target:g}",
               ok and meets(value, op, target), lines=[target_line(prefix, name, value, op, target)])


def info_row(figure: str, measured: str, baseline: str, ratio: float | None = None) -> Row:
    return Row(figure, measured, baseline, ratio, "-", None)


def infeasible_row(prefix: str, name: str, value: float, measured: str, baseline: str, figure: str,
                   why: str, ok: bool = True) -> Row:
    """A measurement kept where no reading policy can meet a target (``why``: the reason, shown in
    the row and its line): informational, not a missed target. ``ok`` False: the run itself went
    wrong (a job lost or recorded twice) - a miss whatever the value."""
    row = Row(figure, measured, baseline, value, "-", None if ok else False,
              lines=[f"{prefix} {name}: {plain(value)} (info, no target: {why})"])
    row.notes.append(f"no target: {why}")
    return row


def unavailable(figure: str, target: str, why: str) -> Row:
    return Row(figure, f"n/a ({why})", "-", None, target, None, status="n/a")


def failed(figure: str, target: str, error: BaseException) -> Row:
    text = f"{type(error).__name__}: {error}"
    return Row(figure, f"error: {text[:200]}", "-", None, target, None, status="error")


HEADERS = ("figure", "measured", "baseline (same run)", "ratio", "target", "")


def code_version(root: str) -> str:
    """HEAD's short sha, and how many tracked files differ from it (read-only git commands)."""
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "code: unknown (no git)"
    return f"commit {sha}" + (f" + uncommitted changes in {len(dirty)} tracked file(s)" if dirty else "")


def environment_line(started: datetime, seconds: float, root: str = ".") -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores (load average {load:.1f} at the end: other "
            f"work shares them), bench wall time {seconds:.0f} s, {code_version(root)}")


def print_table(rows: list[Row], title: str, footer: list[str]) -> None:
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:  # plain text
        print(title)
        for row in rows:
            print(" | ".join((row.figure, row.measured, row.baseline, row.ratio_text, row.target, row.verdict)))
        _print_lines(rows, footer, print)
        return
    console = Console(width=max(Console().width, 180))
    table = Table(title=title, show_lines=True)
    for header in HEADERS:
        table.add_column(header, overflow="fold", justify="right" if header == "ratio" else "left")
    styles = {"pass": "green", "MISS": "bold red", "error": "red", "n/a": "yellow", "info": "cyan"}
    for row in rows:
        table.add_row(escape(row.figure), escape(row.measured), escape(row.baseline), row.ratio_text,
                      escape(row.target), f"[{styles.get(row.verdict, 'default')}]{row.verdict}[/]")
    console.print(table)
    for row in rows:
        for note in row.notes:
            console.print(f"  [bold]{escape(row.figure.split(' ', 1)[0])}[/bold] {escape(note)}", highlight=False)
    _print_lines(rows, footer, lambda text: console.print(escape(text), highlight=False, soft_wrap=True))


def _print_lines(rows: list[Row], footer: list[str], emit: Callable[[str], object]) -> None:
    for line in ["", *(line for row in rows for line in row.lines), "", *footer]:
        emit(line)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[Row], title: str, footer: list[str]) -> str:
    out = [f"### {title}", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = (row.figure, row.measured, row.baseline, row.ratio_text, row.target, f"**{row.verdict}**")
        out.append("| " + " | ".join(_md(c) for c in cells) + " |")
    out.append("")
    lines = [line for row in rows for line in row.lines]
    if lines:
        out += ["```", *lines, "```", ""]
    notes = [(row.figure.split(" ", 1)[0], note) for row in rows for note in row.notes]
    if notes:
        out += ["Notes:", ""] + [f"- **{ref}** {_md(note)}" for ref, note in notes] + [""]
    out += [f"{line}  " for line in footer] + [""]
    return "\n".join(out)


def now_utc() -> datetime:
    return datetime.now(UTC)
