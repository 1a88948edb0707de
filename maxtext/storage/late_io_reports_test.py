"""Tests for late_io_reports: real interpreter hooks in a child interpreter."""

import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

# Runs in a child interpreter, whose hooks and stderr are its own.
_PRELUDE = textwrap.dedent("""
    import asyncio, gc, sys
    from maxtext.storage import late_io_reports

    def closed_loop_error():
      loop = asyncio.new_event_loop()
      loop.close()
      try:
        loop.call_soon_threadsafe(print)
      except RuntimeError as e:
        # What a foreign thread's callback hands the interpreter: the
        # traceback from asyncio's own frame on (no Python caller).
        return e, e.__traceback__.tb_next
      raise AssertionError("a closed loop took a callback")

    def unraisable_without_object(e, tb):
      # What a foreign thread's failed callback becomes when its binding
      # reports it as unraisable with no object (PyErr_WriteUnraisable(NULL)):
      # the hook's argument type is the interpreter's own, taken from a
      # real report.
      seen = []
      hook, sys.unraisablehook = sys.unraisablehook, seen.append
      collect_failing_coroutine("/site-packages/other/module.py")
      sys.unraisablehook = hook
      args_type = type(seen[0])
      sys.unraisablehook(args_type((type(e), e, tb, None, None)))

    def collect_failing_coroutine(filename):
      # A coroutine suspended at an await, whose clean-up raises when it
      # is collected: the interpreter reports that to sys.unraisablehook.
      code = compile(
          "async def read_array():\\n"
          "  try:\\n"
          "    await Suspend()\\n"
          "  finally:\\n"
          "    raise Exception('Encountered error while reading array index')\\n",
          filename, "exec")
      class Suspend:
        def __await__(self):
          yield
      scope = {"Suspend": Suspend}
      exec(code, scope)
      coro = scope["read_array"]()
      coro.send(None)
      del coro
      gc.collect()
""")


def _run(body: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
  return subprocess.run(
      [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )


class LateIoReportsTest(absltest.TestCase):

  def test_without_the_hooks_each_report_prints_a_traceback(self):
    # The cases below are real: uninstalled, the interpreter prints them.
    proc = _run("""
        e, tb = closed_loop_error()
        sys.excepthook(type(e), e, tb)
        e, tb = closed_loop_error()
        unraisable_without_object(e, tb)
        collect_failing_coroutine("/site-packages/orbax/serialization.py")
    """)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stderr.count("Traceback"), 3, proc.stderr)
    self.assertIn("Event loop is closed", proc.stderr)
    self.assertIn("Exception ignored in: <coroutine", proc.stderr)

  def test_installed_late_reports_are_one_warning_line(self):
    proc = _run("""
        late_io_reports.install()
        late_io_reports.install()
        for _ in range(3):
          e, tb = closed_loop_error()
          sys.excepthook(type(e), e, tb)
          e, tb = closed_loop_error()
          unraisable_without_object(e, tb)
        collect_failing_coroutine("/site-packages/orbax/serialization.py")
        print(late_io_reports.reports_seen())
    """)
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertEqual(proc.stdout.strip(), "7")
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(
        proc.stderr.count("is still finishing in the background"),
        1,
        proc.stderr,
    )
    self.assertIn("RuntimeError: Event loop is closed", proc.stderr)

  def test_other_errors_keep_their_tracebacks(self):
    proc = _run("""
        late_io_reports.install()
        # Another library's coroutine, and a bug in the main program.
        collect_failing_coroutine("/site-packages/other/module.py")
        raise RuntimeError("Event loop is closed")
    """)
    self.assertEqual(proc.returncode, 1)
    self.assertIn("Exception ignored in: <coroutine", proc.stderr)
    # The main program's own error, raised from <string>, is not a late
    # report even with the same message.
    self.assertIn('File "<string>"', proc.stderr)
    self.assertEqual(proc.stderr.count("Traceback"), 2, proc.stderr)
    self.assertNotIn("still finishing", proc.stderr)


if __name__ == "__main__":
  absltest.main()
