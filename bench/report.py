"""The results table: rich on the terminal, Markdown for the README."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime


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
    ratio_fmt: str = "{:.3f}"
    status: str | None = None  # overrides the pass/fail text ("n/a", "error", "info")

    @property
    def ratio_text(self) -> str:
        return "-" if self.ratio is None else self.ratio_fmt.format(self.ratio)

    @property
    def verdict(self) -> str:
        if self.status:
            return self.status
        if self.passed is None:
            return "info"
        return "pass" if self.passed else "FAIL"


def unavailable(figure: str, target: str, why: str) -> Row:
    return Row(figure, f"n/a ({why})", "-", None, target, None, status="n/a")


def failed(figure: str, target: str, error: BaseException) -> Row:
    text = f"{type(error).__name__}: {error}"
    return Row(figure, f"error: {text[:160]}", "-", None, target, None, status="error")


HEADERS = ("figure", "measured", "baseline", "ratio", "target", "pass/fail")


def code_version(root: str) -> str:
    """HEAD's short sha, and how many files differ from it (read-only git commands)."""
    import subprocess

    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "code: unknown (no git)"
    return f"code: {sha}" + (f" + uncommitted changes in {len(dirty)} file(s)" if dirty else "")


def environment_line(started: datetime, seconds: float, root: str = ".") -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores (load average {load:.2f} at the end: other "
            f"work shares them), bench wall time {seconds:.0f} s, {code_version(root)}")


def print_table(rows: list[Row], title: str, footer: list[str]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        print(title)
        for row in rows:
            print(" | ".join((row.figure, row.measured, row.baseline, row.ratio_text, row.target, row.verdict)))
        for line in footer:
            print(line)
        return
    from rich.markup import escape

    console = Console(width=max(Console().width, 180))
    table = Table(title=title, show_lines=True)
    for header in HEADERS:
        table.add_column(header, overflow="fold", justify="right" if header == "ratio" else "left")
    styles = {"pass": "green", "FAIL": "bold red", "error": "red", "n/a": "yellow", "info": "cyan"}
    for row in rows:
        verdict = row.verdict
        table.add_row(escape(row.figure), escape(row.measured), escape(row.baseline), row.ratio_text,
                      escape(row.target), f"[{styles.get(verdict, 'default')}]{verdict}[/]")
    console.print(table)
    notes = [(row.figure.split(" ", 1)[0], note) for row in rows for note in row.notes]
    for ref, note in notes:
        console.print(f"  [bold]{escape(ref)}[/bold] {escape(note)}", highlight=False)
    for line in footer:
        console.print(escape(line), highlight=False)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[Row], title: str, footer: list[str]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = (row.figure, row.measured, row.baseline, row.ratio_text, row.target, f"**{row.verdict}**")
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines.append("")
    notes = [(row.figure.split(" ", 1)[0], note) for row in rows for note in row.notes]
    if notes:
        lines.append("Notes:")
        lines.append("")
        lines.extend(f"- **{ref}** {_md(note)}" for ref, note in notes)
        lines.append("")
    lines.extend(f"{line}  " for line in footer)
    lines.append("")
    return "\n".join(lines)


def now_utc() -> datetime:
    return datetime.now(UTC)
