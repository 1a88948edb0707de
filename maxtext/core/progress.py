"""Progress of long work: one line that says how far it is, and its ETA.

A `Reporter` says where the lines go (an `Output`) and how often; its
`start(label, total, unit)` begins one job's `Progress`, which the job moves
on as it goes (`update`, `advance`) and ends with `finish` (or by leaving
its `with` block). A line reads

  import_checkpoint: converting: 312.4 GB of 750.0 GB (42%), 1.1 GB/s,
      4m 44s elapsed, ETA 6m 38s; tensors 25112/60042, shard
      model-00040-of-00094.safetensors

(one line; `label` is "import_checkpoint: converting", what follows the
";" the job's `detail`), and the last one

  import_checkpoint: converting: done, 750.0 GB in 11m 20s (1.1 GB/s);
      tensors 60042/60042, shard model-00094-of-00094.safetensors

`unit` BYTES counts bytes (printed in decimal units, kB to TB); any other
unit names what is counted ("records", "checkpoints"); a job without a
total has no percentage nor ETA, and one that counts nothing (a compile, an
orbax restore) says only its elapsed time: `Reporter.waiting(label)` reports
it from a background thread while the block runs.

On a terminal (`Terminal`) the line is redrawn in place, at most every
`REDRAW_S`; anywhere else (`Lines`: a log file, CI, a pod's log, the
logger) a plain line every `interval_s` at most, never more often, and the
last line. A job that ends before its first line says nothing with
`quiet_if_short` (the background work of a run: a checkpoint's checksums, a
mirror pass), nor when it fails (its error is then the one line); otherwise
it always prints its last line. Progress never goes to stdout, where the
tools print what scripts read: `stderr()` or `log()`.
"""

import contextlib
import dataclasses
import sys
import threading
import time
from typing import Callable, Iterator, Optional, Protocol, TextIO

from absl import logging

from maxtext.core import checks

# The unit of a job that counts bytes.
BYTES = "bytes"
# Seconds between two redraws of a terminal's line.
REDRAW_S = 0.5
# ANSI "erase to the end of the line": a shorter line leaves nothing behind.
_ERASE_TO_END = "\x1b[K"
_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(n: float) -> str:
  """`n` bytes in decimal units: "512 B", "12.3 GB"."""
  for unit in _BYTE_UNITS[:-1]:
    if abs(n) < 1000:
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  return f"{n:.1f} {_BYTE_UNITS[-1]}"


def format_duration(seconds: float) -> str:
  """ "42 s", "23m 50s", "2h 05m"."""
  seconds = max(0, round(seconds))
  if seconds < 60:
    return f"{seconds} s"
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f"{minutes}m {seconds:02d}s"
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h {minutes:02d}m"


class Output(Protocol):
  """Where progress lines go."""

  # True when each line replaces the one before (a terminal).
  redraws: bool

  def show(self, line: str, last: bool) -> None:
    """Shows `line`; `last` for a job's last line."""


class Lines:
  """Each line handed to `write` (print to stderr, the logger, a list)."""

  redraws = False

  def __init__(self, write: Callable[[str], None]):
    self._write = write

  def show(self, line: str, last: bool) -> None:
    del last
    self._write(line)


class Terminal:
  """One line of `stream`, redrawn in place; the last one ends it."""

  redraws = True

  def __init__(self, stream: TextIO):
    self._stream = stream

  def show(self, line: str, last: bool) -> None:
    self._stream.write(f"\r{line}{_ERASE_TO_END}" + ("\n" if last else ""))
    self._stream.flush()


class Silent:
  """Nothing shown."""

  redraws = False

  def show(self, line: str, last: bool) -> None:
    del line, last


def stderr() -> Output:
  """The process's stderr: redrawn on a terminal, plain lines otherwise."""
  if sys.stderr.isatty():
    return Terminal(sys.stderr)
  return Lines(lambda line: print(line, file=sys.stderr, flush=True))


def log() -> Output:
  """The absl logger, at INFO: plain lines."""
  return Lines(logging.info)


@dataclasses.dataclass(frozen=True)
class Reporter:
  """Where a job's progress lines go and how often.

  Attributes:
    output: where the lines go.
    interval_s: the least seconds between two plain lines (> 0); a
      terminal's line is redrawn every REDRAW_S.
    clock: seconds, monotonic (tests pass their own).
  """

  output: Output
  interval_s: float = 10.0
  clock: Callable[[], float] = time.monotonic

  def __post_init__(self):
    checks.check_number("progress_interval_s", self.interval_s, positive=True)

  def start(
      self,
      label: str,
      total: Optional[float] = None,
      unit: str = "",
      *,
      quiet_if_short: bool = False,
  ) -> "Progress":
    """Begins one job's progress (see the module docstring)."""
    return Progress(self, label, total, unit, quiet_if_short)

  @contextlib.contextmanager
  def waiting(
      self, label: str, *, quiet_if_short: bool = False
  ) -> Iterator["Progress"]:
    """Reports the block's elapsed time while it runs; see `Progress.ticking`.

    The last line says "done" when the block returns, "stopped" when it
    raises.
    """
    job = self.start(label, quiet_if_short=quiet_if_short)
    with job.ticking():
      yield job


SILENT = Reporter(Silent())
# Seconds between the progress lines of long work in the log (a
# checkpoint's save, restore and checksums; the GCS mirror's transfers) when
# no interval is given; a run gives its config's `progress_interval_s`,
# whose default in maxtext/configs/base.py is the same.
LOG_INTERVAL_S = 30.0


def logged(interval_s: float = LOG_INTERVAL_S) -> Reporter:
  """A reporter to the absl logger, a line every `interval_s` at most."""
  return Reporter(log(), interval_s)


class Progress:
  """One job's progress; thread-safe. Made by `Reporter.start`."""

  def __init__(
      self,
      reporter: Reporter,
      label: str,
      total: Optional[float],
      unit: str,
      quiet_if_short: bool,
  ):
    self._reporter = reporter
    self._label = label
    self._total = total
    self._unit = unit
    self._quiet_if_short = quiet_if_short
    self._lock = threading.RLock()
    self._start = reporter.clock()
    self._shown_at = self._start
    self._done: Optional[float] = None
    self._detail = ""
    self._finished = False
    self.lines_shown = 0

  @property
  def done(self) -> float:
    """What is done so far, in the job's unit."""
    return self._done or 0

  def elapsed_s(self) -> float:
    """Seconds since the job started, by the reporter's clock."""
    return self._reporter.clock() - self._start

  def update(
      self, done: Optional[float] = None, detail: Optional[str] = None
  ) -> None:
    """Sets what is done (None keeps it) and the detail after the figures
    (None keeps it); shows a line when one is due."""
    with self._lock:
      if done is not None:
        self._done = done
      if detail is not None:
        self._detail = detail
      now = self._reporter.clock()
      gap = (
          REDRAW_S
          if self._reporter.output.redraws
          else self._reporter.interval_s
      )
      if self._finished or now - self._shown_at < gap:
        return
      self._shown_at = now
      self._show(self._line(now - self._start), last=False)

  def advance(self, amount: float, detail: Optional[str] = None) -> None:
    """Adds `amount` to what is done; as `update`."""
    with self._lock:
      self.update(self.done + amount, detail)

  def finish(self, detail: Optional[str] = None, failed: bool = False) -> None:
    """Shows the last line (unless the job was short and quiet); once."""
    with self._lock:
      if self._finished:
        return
      self._finished = True
      if detail is not None:
        self._detail = detail
      # A failed job that showed nothing leaves the error its one line.
      if (self._quiet_if_short or failed) and not self.lines_shown:
        return
      elapsed = self._reporter.clock() - self._start
      self._show(self._last_line(elapsed, failed), last=True)

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, exc_type, exc, traceback) -> None:
    """Finishes the job: failed when the block raised (so that a terminal's
    line is ended before the error is printed)."""
    self.finish(failed=exc_type is not None)

  @contextlib.contextmanager
  def ticking(self) -> Iterator[None]:
    """Shows the line from a background thread while the block runs, as
    due, then the last line (failed if the block raised).

    For work that reports nothing itself while it runs (a compile, an orbax
    save or restore): the line then says the elapsed time.
    """
    stop = threading.Event()
    poll = min(REDRAW_S, self._reporter.interval_s)

    def tick():
      while not stop.wait(poll):
        self.update()

    thread = threading.Thread(target=tick, name="progress", daemon=True)
    thread.start()
    try:
      yield
    except BaseException:
      stop.set()
      thread.join()
      self.finish(failed=True)
      raise
    stop.set()
    thread.join()
    self.finish()

  def _show(self, line: str, last: bool) -> None:
    self.lines_shown += 1
    self._reporter.output.show(line, last)

  def _amount(self, value: float) -> str:
    if self._unit == BYTES:
      return format_bytes(value)
    return f"{value:,.0f}" + (f" {self._unit}" if self._unit else "")

  def _rate(self, elapsed: float) -> str:
    rate = self.done / max(elapsed, 1e-9)
    if self._unit == BYTES:
      return f"{format_bytes(rate)}/s"
    return f"{rate:.3g} {self._unit or 'items'}/s"

  def _of_total(self) -> str:
    """ "120 of 1,540 tensors (8%)", "12.3 GB", ""."""
    if self._done is None:
      return ""
    if self._total is None:
      return self._amount(self.done)
    total = self._amount(self._total)
    if self._unit and self._unit != BYTES:
      done = f"{self.done:,.0f}"
    else:
      done = self._amount(self.done)
    percent = 100 * self.done / self._total if self._total else 100
    return f"{done} of {total} ({percent:.0f}%)"

  def _line(self, elapsed: float) -> str:
    """A line while the job runs: amount, rate, elapsed time, ETA."""
    parts = []
    if self._done is not None:
      parts += [self._of_total(), self._rate(elapsed)]
    parts.append(f"{format_duration(elapsed)} elapsed")
    if self._total is not None and self.done > 0:
      left = elapsed * max(self._total - self.done, 0) / self.done
      parts.append(f"ETA {format_duration(left)}")
    return self._with_detail(f"{self._label}: {', '.join(parts)}")

  def _last_line(self, elapsed: float, failed: bool) -> str:
    """The job's last line: done (amount, time, average rate) or stopped."""
    took = format_duration(elapsed)
    if failed:
      text = f"stopped after {took}"
      if self._done is not None:
        text += f" at {self._of_total()}"
    elif self._done is None:
      text = f"done in {took}"
    else:
      text = (
          f"done, {self._amount(self.done)} in {took} ({self._rate(elapsed)})"
      )
    return self._with_detail(f"{self._label}: {text}")

  def _with_detail(self, line: str) -> str:
    return f"{line}; {self._detail}" if self._detail else line
