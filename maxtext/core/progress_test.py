"""Tests for maxtext.core.progress, on a clock the test moves."""

import io
import threading

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.core import progress


class Clock:
  """Seconds the test sets."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


class ProgressTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.clock = Clock()
    self.lines = []
    self.reporter = progress.Reporter(
        progress.Lines(self.lines.append), interval_s=10.0, clock=self.clock
    )

  def test_bytes_job_lines_every_interval_and_the_last(self):
    job = self.reporter.start("import", total=4_000_000_000, unit="bytes")
    for i in range(4):
      self.clock.now += 6  # Lines are due at 12 s and 24 s (10 s apart).
      job.advance(500_000_000, f"tensors {i + 1}/4")
    self.assertEqual(
        self.lines,
        [
            "import: 1.0 GB of 4.0 GB (25%), 83.3 MB/s, 12 s elapsed, ETA"
            " 36 s; tensors 2/4",
            "import: 2.0 GB of 4.0 GB (50%), 83.3 MB/s, 24 s elapsed, ETA"
            " 24 s; tensors 4/4",
        ],
    )
    job.finish("tensors 4/4")
    job.finish("again")  # Once only.
    self.assertLen(self.lines, 3)
    self.assertEqual(
        self.lines[-1], "import: done, 2.0 GB in 24 s (83.3 MB/s); tensors 4/4"
    )

  def test_counted_job_names_its_unit(self):
    job = self.reporter.start("demonstrations", total=2056, unit="records")
    self.clock.now += 60
    job.update(514)
    self.clock.now += 3600
    job.update(2056, "tool runs 9000")
    job.finish()
    self.assertEqual(
        self.lines,
        [
            "demonstrations: 514 of 2,056 records (25%), 8.57 records/s, 1m 00s"
            " elapsed, ETA 3m 00s",
            "demonstrations: 2,056 of 2,056 records (100%), 0.562 records/s,"
            " 1h 01m elapsed, ETA 0 s; tool runs 9000",
            "demonstrations: done, 2,056 records in 1h 01m (0.562 records/s);"
            " tool runs 9000",
        ],
    )

  def test_a_short_job_prints_only_its_last_line_or_nothing_when_quiet(self):
    job = self.reporter.start("export", total=10, unit="tensors")
    for _ in range(10):
      self.clock.now += 0.5
      job.advance(1)
    job.finish()
    self.assertEqual(
        self.lines, ["export: done, 10 tensors in 5 s (2 tensors/s)"]
    )
    quiet = self.reporter.start("mirror pass", quiet_if_short=True)
    quiet.update(5)
    quiet.finish()
    self.assertLen(self.lines, 1)
    # A quiet job that did show a line shows its last one too.
    quiet = self.reporter.start(
        "mirror pass", unit="bytes", quiet_if_short=True
    )
    self.clock.now += 11
    quiet.update(1500)
    quiet.finish()
    self.assertEqual(
        self.lines[1:],
        [
            "mirror pass: 1.5 kB, 136 B/s, 11 s elapsed",
            "mirror pass: done, 1.5 kB in 11 s (136 B/s)",
        ],
    )

  def test_a_failed_job_says_where_it_stopped_once_it_showed_a_line(self):
    with self.assertRaises(OSError):
      with self.reporter.start("restore", total=8, unit="files") as job:
        self.clock.now += 3
        job.update(2)
        raise OSError("disk")
    self.assertEqual(self.lines, [])  # The error is the one line.
    with self.assertRaises(OSError):
      with self.reporter.start("restore", total=8, unit="files") as job:
        self.clock.now += 12
        job.update(2)
        raise OSError("disk")
    self.assertEqual(
        self.lines,
        [
            "restore: 2 of 8 files (25%), 0.167 files/s, 12 s elapsed, ETA"
            " 36 s",
            "restore: stopped after 12 s at 2 of 8 files (25%)",
        ],
    )

  def test_a_terminal_redraws_one_line(self):
    stream = io.StringIO()
    reporter = progress.Reporter(
        progress.Terminal(stream), interval_s=30.0, clock=self.clock
    )
    job = reporter.start("upload", total=3, unit="objects")
    for _ in range(3):
      self.clock.now += progress.REDRAW_S
      job.advance(1)
    job.finish()
    self.assertEqual(
        stream.getvalue().split("\r")[1:],
        [
            "upload: 1 of 3 objects (33%), 2 objects/s, 0 s elapsed, ETA 1 s"
            "\x1b[K",
            "upload: 2 of 3 objects (67%), 2 objects/s, 1 s elapsed, ETA 0 s"
            "\x1b[K",
            "upload: 3 of 3 objects (100%), 2 objects/s, 2 s elapsed, ETA 0 s"
            "\x1b[K",
            "upload: done, 3 objects in 2 s (2 objects/s)\x1b[K\n",
        ],
    )

  def test_waiting_reports_elapsed_time_from_a_thread(self):
    two_lines = threading.Event()

    def show(line):
      self.lines.append(line)
      if len(self.lines) == 2:
        two_lines.set()

    def clock():
      self.clock.now += 0.25  # Each reading a quarter second later.
      return self.clock.now

    reporter = progress.Reporter(
        progress.Lines(show), interval_s=0.5, clock=clock
    )
    with reporter.waiting("compiling micro_step"):
      self.assertTrue(two_lines.wait(timeout=60))
    self.assertGreaterEqual(len(self.lines), 3)
    for line in self.lines[:-1]:
      self.assertRegex(line, r"^compiling micro_step: \d+ s elapsed$")
    self.assertRegex(self.lines[-1], r"^compiling micro_step: done in \d+ s$")

  def test_waiting_says_stopped_when_the_block_raises(self):
    with self.assertRaisesRegex(RuntimeError, "out of memory"):
      with self.reporter.waiting("restoring step 8") as job:
        self.clock.now += 75
        job.update()  # As the thread would.
        raise RuntimeError("out of memory")
    self.assertEqual(
        self.lines,
        [
            "restoring step 8: 1m 15s elapsed",
            "restoring step 8: stopped after 1m 15s",
        ],
    )

  @parameterized.named_parameters(
      ("bytes", progress.format_bytes, 999, "999 B"),
      ("kilobytes", progress.format_bytes, 1000, "1.0 kB"),
      ("terabytes", progress.format_bytes, 7.5e14, "750.0 TB"),
      ("seconds", progress.format_duration, 59.4, "59 s"),
      ("minutes", progress.format_duration, 3599, "59m 59s"),
      ("hours", progress.format_duration, 7500, "2h 05m"),
  )
  def test_formats(self, fn, value, text):
    self.assertEqual(fn(value), text)

  def test_bad_interval(self):
    with self.assertRaisesRegex(ValueError, r"progress_interval_s must be > 0"):
      progress.Reporter(progress.Silent(), interval_s=0)

  def test_silent_shows_nothing(self):
    job = progress.SILENT.start("x", total=1)
    job.update(1)
    job.finish()
    self.assertEqual(job.lines_shown, 1)


if __name__ == "__main__":
  absltest.main()
