"""Running and reporting a benchmark: command line, header and footer, statistics, tables, targets."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NAN = math.nan


def log(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Statistics and formatting
# --------------------------------------------------------------------------------------------


def _finite(values: Iterable[Any]) -> list[float]:
    return [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]


def median(values: Iterable[Any]) -> float:
    """The median of the finite numbers in ``values`` (None and nan skipped), nan if none."""
    v = _finite(values)
    return statistics.median(v) if v else NAN


def spread(values: Iterable[Any]) -> float:
    """``(max - min) / median`` of the finite values; 0 with fewer than two."""
    v = _finite(values)
    return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else 0.0


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile, interpolated linearly between ranks as numpy's default does."""
    v = sorted(values)
    if not v:
        return NAN
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def medians(records: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    """The median of each key over result records, as `median` takes it (missing, None, nan skipped).

    Args:
        records: result records, e.g. one per fresh process of a row.
        keys: the keys to summarize.

    Returns:
        ``{key: median}`` in the order of ``keys``; nan where no record has a finite value.
    """
    recs = list(records)
    return {k: median(r.get(k) for r in recs) for k in keys}


def div(num: Any, den: Any) -> float:
    """``num / den`` for a ratio against a reference row, nan where there is no ratio.

    A reference row that was not run (None), failed (nan) or measured nothing (0) gives nan,
    which the tables print as ``n/a`` (or ``-``): a missing reference must not fail a report.

    Args:
        num: the row's value.
        den: the reference's value.

    Returns:
        The ratio, or nan.
    """
    if not isinstance(num, (int, float)) or not isinstance(den, (int, float)) or not den:
        return NAN
    return num / den


def pair_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-pair ratios ``num[i] / den[i]`` of two sides timed in the same rounds (see `abba`).

    The median of these is robust to a drift of the machine's speed, which hits both sides of a
    round alike; a ratio of the two sides' medians is not.

    Args:
        num: one side's measurements, one per round.
        den: the other side's, as many.

    Returns:
        One ratio per round.

    Raises:
        ValueError: if the sides have different lengths.
    """
    return [a / b for a, b in zip(num, den, strict=True)]


def find(rows: Iterable[Any], **match: Any) -> Any:
    """The first row whose attributes (or keys, for a dict) equal ``match``, or None.

    This is how a script names the reference row of a ratio (``h.find(rows, group=w,
    kind="bare")``); a key whose value is None in ``match`` matches anything.

    Args:
        rows: `Row` objects, dataclasses or dicts.
        **match: attribute or key values the row must have.

    Returns:
        The row, or None if none matches.
    """

    def get(r: Any, k: str) -> Any:
        return r.get(k) if isinstance(r, dict) else getattr(r, k, None)

    return next((r for r in rows if all(v is None or get(r, k) == v for k, v in match.items())), None)


def gap_summary(gaps_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max (milliseconds) and the count of heartbeat gaps given in seconds."""
    ms = [g * 1e3 for g in gaps_s]
    return {
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms, default=NAN),
        "ticks": len(ms),
    }


def gap_line(label: str, v: dict[str, Any], width: int, inside: str = "", after: str = "") -> str:
    """One console line of a `gap_summary`: p50, p99, max and the tick count.

    Args:
        label: what the heartbeat shared its loop with, padded to ``width``.
        v: the summary (``p50_ms``, ``p99_ms``, ``max_ms``, ``ticks``).
        width: the label column's width.
        inside: added inside the parentheses, after the tick count.
        after: added at the end of the line.

    Returns:
        The line, indented by two spaces.
    """
    return (
        f"  {label:<{width}} p50 {v['p50_ms']:6.2f} ms  p99 {v['p99_ms']:6.2f} ms  "
        f"max {v['max_ms']:7.2f} ms  ({v['ticks']} ticks{inside}){after}"
    )


def ratio_summary(ratios: Sequence[float]) -> dict[str, float]:
    """Median, quartiles (nearest rank at or below), min and max of paired ratios."""
    r = sorted(ratios)

    def rank(f: float) -> float:
        return r[min(len(r) - 1, int(f * len(r)))]

    return {"median": statistics.median(r), "p25": rank(0.25), "p75": rank(0.75), "min": r[0], "max": r[-1]}


def fmt_x(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "n/a"


def fmt_n(x: float, digits: int = 0, sep: bool = False) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.{digits}f}" if sep else f"{x:.{digits}f}"


def fmt_s(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3f}" if x < 1 else f"{x:.2f}"


def fmt_ms(x: float) -> str:
    """Seconds shown as milliseconds with one decimal."""
    return "n/a" if not math.isfinite(x) else f"{x * 1e3:.1f}"


def fmt_pct(x: float) -> str:
    return f"{x * 100:.0f}%" if math.isfinite(x) else "n/a"


# --------------------------------------------------------------------------------------------
# Tables and targets
# --------------------------------------------------------------------------------------------

Cell = str | Callable[[Any], str]


@dataclass
class Col:
    """A table column: its heading, how a record becomes its cell (a format string applied to
    the record's keys, or a function of the record), minimum console width, alignment."""

    head: str
    cell: Cell = ""
    width: int = 0
    left: bool = False


def gap_columns(title: str) -> list[Col]:
    """The Markdown columns of heartbeat `gap_summary` records labelled ``label``: p50, p99, max.

    Args:
        title: the first column's heading (what the loop was doing).

    Returns:
        The columns.
    """
    return [Col(title, "{label}", left=True), *(Col(f"{p} gap (ms)", f"{{{p}_ms:.2f}}") for p in ("p50", "p99", "max"))]


def ratio(key: str, missing: str = "n/a") -> Callable[[Any], str]:
    """A cell showing ``record[key]`` as a ratio (``1.23x``), or ``missing`` when not finite."""
    return lambda r: fmt_x(r[key]) if math.isfinite(r[key]) else missing


def cells(cols: Sequence[Col], records: Iterable[Any]) -> list[list[str]]:
    """One list of cells per record. A record that is already a list of strings (an error
    message in place of the numbers, say) is kept as it is."""
    out = []
    for r in records:
        if isinstance(r, (list, tuple)):
            out.append([str(c) for c in r])
        else:
            out.append([c.cell(r) if callable(c.cell) else c.cell.format_map(r) for c in cols])
    return out


def console_table(cols: Sequence[Col], records: Iterable[Any], indent: str = "") -> list[str]:
    """Header, rule and rows, each cell padded to its column (numbers to the right). A short
    row is printed as it is after its last cell."""
    rows = cells(cols, records)
    widths = [max([c.width, len(c.head)] + [len(r[i]) for r in rows if i < len(r) - 1]) for i, c in enumerate(cols)]

    def line(row: Sequence[str]) -> str:
        short = len(row) < len(cols)
        out = [
            cell if short and i == len(row) - 1 else cell.ljust(widths[i]) if cols[i].left else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        return indent + " ".join(out).rstrip()

    head = line([c.head for c in cols])
    return [head, indent + "-" * (len(head) - len(indent)), *(line(r) for r in rows)]


def markdown_table(cols: Sequence[Col], records: Iterable[Any]) -> list[str]:
    """A Markdown table (text columns left-aligned, numbers right); short rows are padded."""
    out = [
        "| " + " | ".join(c.head for c in cols) + " |",
        "|" + "|".join(" --- " if c.left else " ---: " for c in cols) + "|",
    ]
    for r in cells(cols, records):
        out.append("| " + " | ".join([*r, *[""] * (len(cols) - len(r))]) + " |")
    return out


class Checks:
    """The targets: each a description, a verdict (True, False, or None for SKIP) and a value."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bool | None, str]] = []
        self.crashed = False  # a row raised: a bug, not noise, so the exit code says so always

    def add(self, desc: str, ok: bool | None, value: str) -> None:
        self.items.append((desc, ok, value))

    def add_runs(self, runs: Mapping[Any, list[dict[str, Any]]]) -> None:
        """The check that every run of every row returned a result (no ``"error"`` record).

        A failed run drops out of its row's medians, and a row none of whose runs worked out
        of the table: without this check a row broken by a code change would just vanish.
        """
        failed = [(key, r["error"]) for key, rs in runs.items() for r in rs if "error" in r]
        total = sum(len(rs) for rs in runs.values())
        if failed:
            self.crashed = True
            key, error = failed[0]
            value = f"{len(failed)} of {total} failed; first: {key}: {str(error)[:200]}"
        else:
            value = f"{total} of {total}"
        self.add("every run of every row returned a result", not failed, value)

    @property
    def failed(self) -> bool:
        return any(ok is False for _, ok, _ in self.items)

    def report(self) -> None:
        log("\nTargets:")
        for desc, ok, val in self.items:
            log(f"  [{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {desc}: {val}")

    def exit_code(self, strict: bool) -> int:
        """1 if a run crashed (`add_runs`) or, with ``strict``, a target FAILed; else 0.

        Shared machines are noisy, so a missed target fails the exit code only when asked;
        a crash is never noise.
        """
        return 1 if self.crashed or (strict and self.failed) else 0

    def as_json(self) -> list[dict[str, Any]]:
        return [{"check": d, "ok": ok, "value": v} for d, ok, v in self.items]


# --------------------------------------------------------------------------------------------
# A run: command line, header, footer, JSON
# --------------------------------------------------------------------------------------------


def parser(
    doc: str | None,
    *,
    quick: str,
    repeats: str | None = None,
    target_seconds: str | None = None,
    no_torchrl: str | None = None,
    strict: bool = True,
) -> argparse.ArgumentParser:
    """An argument parser with the options the scripts share, each given its help text (None:
    the script does not have it), and ``--json``. Description: the docstring's first paragraph."""
    ap = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0], epilog="See benchmarks/README.md for what each row means."
    )
    ap.add_argument("--quick", action="store_true", help=quick)
    if repeats:
        ap.add_argument("--repeats", type=int, default=None, help=repeats)
    if target_seconds:
        ap.add_argument("--target-seconds", type=float, default=None, help=target_seconds)
    if no_torchrl:
        ap.add_argument("--no-torchrl", action="store_true", help=no_torchrl)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    if strict:
        ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target FAILs")
    return ap


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return NAN


def dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


class Session:
    """One run of a script: its clock, the load average at start and end, the package versions."""

    def __init__(self, *packages: str, **versions: str) -> None:
        self.t_start, self.load_start = time.perf_counter(), loadavg()
        self.elapsed, self.load_end = NAN, NAN
        self.versions = {"python": platform.python_version()}
        self.versions.update({p: dist_version(p) for p in packages})
        self.versions.update(versions)

    def header(self, first: str, machine: str, *notes: str) -> None:
        """The first line; platform, CPU count and ``machine``; versions; notes; load average."""
        log(first)
        log(f"  {platform.platform()}, {os.cpu_count()} CPUs" + (f", {machine}" if machine else ""))
        log("  " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        for note in notes:
            log(f"  {note}")
        log(f"  load average (1 min) at start: {self.load_start:.2f}")
        if self.load_start > 0.5:
            log("  WARNING: the machine is not idle; other processes share the CPUs and add noise.")

    def versions_line(self, *keys: str) -> str:
        """``Python 3.11.7, torch 2.13.0, ...``: the start of a Markdown table's footnote."""
        return ", ".join(f"{'Python' if k == 'python' else k} {self.versions[k]}" for k in keys)

    def markdown(self, lines: list[str], note: str) -> None:
        """Print a Markdown block: ``lines`` (the tables), then an italic footnote.

        The footnote starts with the versions that matter for every table (Python, torch,
        tensordict, gymnasium, TorchRL, aiocollect) and the CPU count, so that a table pasted
        into the docs says where it was measured.

        Args:
            lines: the tables' lines.
            note: the rest of the footnote, from its separator on (``"; 2 nodes"``), without
                the final period.
        """
        versions = self.versions_line("python", "torch", "tensordict", "gymnasium", "torchrl", "aiocollect")
        log("\nMarkdown:\n")
        log("\n".join([*lines, "", f"_{versions}; {os.cpu_count()} CPUs{note}._"]))

    def footer(self, adds: str = "") -> None:
        """Total time and the load average at start and end (``adds``: what this run adds to it)."""
        self.elapsed, self.load_end = time.perf_counter() - self.t_start, loadavg()
        log(
            f"\ntotal time {self.elapsed:.1f} s; load average (1 min) {self.load_start:.2f} at start, "
            f"{self.load_end:.2f} at end" + (f" ({adds})" if adds else "")
        )

    def write_json(self, path: str | None, **result: Any) -> None:
        """Write the versions, load averages, ``result`` and the elapsed time to ``path`` (if any)."""
        if path:
            out = {"versions": self.versions, "load_avg": [self.load_start, self.load_end], **result}
            out["elapsed_s"] = self.elapsed
            with open(path, "w") as f:
                json.dump(out, f, indent=2, default=str)


def torchrl_note(disabled: bool, *, import_it: bool = False) -> str | None:
    """Why TorchRL rows cannot run, or None. ``import_it=False`` only looks for the package:
    importing TorchRL changes the process-wide multiprocessing start method."""
    if disabled:
        return "disabled with --no-torchrl"
    import importlib.util

    if importlib.util.find_spec("torchrl") is None:
        return "torchrl is not installed"
    if import_it:
        try:
            import logging

            import torchrl.collectors  # noqa: F401

            logging.getLogger("torchrl").setLevel(logging.WARNING)  # silence its INFO chatter
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    return None


def first_attr(module: Any, names: Sequence[str]) -> tuple[Any, str]:
    """``(module.name, name)`` for the first of ``names`` the module has (0.14 names, then legacy)."""
    for n in names:
        if hasattr(module, n):
            return getattr(module, n), n
    raise AttributeError(f"{module.__name__} has none of {list(names)}")
