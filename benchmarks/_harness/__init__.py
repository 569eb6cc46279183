"""The benchmarks' shared harness: a script declares its workloads and rows, this does the rest.

Every ``benchmarks/bench_*.py`` imports it as a sibling (``import _harness as h``, after putting
its own directory on ``sys.path``, so it runs from any working directory). Three parts, by concept:

* `_report` runs and reports a benchmark: `parser` (the shared options: ``--quick``,
  ``--repeats``, ``--target-seconds``, ``--no-torchrl``, ``--json``, ``--strict``), `Session`
  (header with platform, versions and load average; footer; the JSON file), `Checks` (targets,
  PASS/FAIL/SKIP, the ``--strict`` exit status), `Col` with `console_table` and `markdown_table`
  (a table is a list of columns, each saying how a result record becomes its cell), `median`,
  `spread`, `percentile`, `gap_summary`, `ratio_summary` and the ``fmt_*`` helpers,
  `torchrl_note` and `first_attr`;
* `_timing` measures in one process: `BatchClock` and `measure_iter` (construction to first
  batch, steady-state frames/s, CPU, close time), `Row`, `Settings` and `run_rows` (a warmup that
  sizes each row's runs, then the rows round robin), `abba` (two sides alternating, for paired
  ratios), `Heartbeat` and `idle_gaps` (how late an event loop runs a 1 ms sleeper);
* `_procs` measures in fresh processes: `run_child`, `child_entry` and `run_process` (a new
  interpreter in its own process group prints one JSON result line; killed on timeout, and
  whatever it leaves behind is killed and reported), `time_command` (the import floor),
  `live_children` and `wait_children_gone` (leak checks), `free_port_block`.

Nothing here imports more than the standard library at import time: worker and node processes
re-import the scripts, and so this package, to unpickle what they run, and must not pay for
anything else (anyio and psutil are imported by the functions that use them).
"""

from ._procs import RESULT_TAG as RESULT_TAG
from ._procs import child_entry as child_entry
from ._procs import child_processes as child_processes
from ._procs import free_port_block as free_port_block
from ._procs import fresh_rounds as fresh_rounds
from ._procs import live_children as live_children
from ._procs import run_child as run_child
from ._procs import run_process as run_process
from ._procs import time_command as time_command
from ._procs import wait_children_gone as wait_children_gone
from ._report import NAN as NAN
from ._report import Checks as Checks
from ._report import Col as Col
from ._report import Session as Session
from ._report import console_table as console_table
from ._report import div as div
from ._report import find as find
from ._report import first_attr as first_attr
from ._report import fmt_ms as fmt_ms
from ._report import fmt_n as fmt_n
from ._report import fmt_pct as fmt_pct
from ._report import fmt_s as fmt_s
from ._report import fmt_x as fmt_x
from ._report import gap_columns as gap_columns
from ._report import gap_line as gap_line
from ._report import gap_summary as gap_summary
from ._report import log as log
from ._report import markdown_table as markdown_table
from ._report import median as median
from ._report import medians as medians
from ._report import pair_ratios as pair_ratios
from ._report import parser as parser
from ._report import percentile as percentile
from ._report import ratio as ratio
from ._report import ratio_summary as ratio_summary
from ._report import spread as spread
from ._report import torchrl_note as torchrl_note
from ._timing import BatchClock as BatchClock
from ._timing import Heartbeat as Heartbeat
from ._timing import Row as Row
from ._timing import Run as Run
from ._timing import Settings as Settings
from ._timing import abba as abba
from ._timing import abba_order as abba_order
from ._timing import async_call_runner as async_call_runner
from ._timing import batch_dones as batch_dones
from ._timing import batch_frames as batch_frames
from ._timing import calibrate_calls as calibrate_calls
from ._timing import call_runner as call_runner
from ._timing import idle_gaps as idle_gaps
from ._timing import iter_shutdown as iter_shutdown
from ._timing import measure_iter as measure_iter
from ._timing import round_robin as round_robin
from ._timing import run_rows as run_rows
from ._timing import timed as timed
