"""Tests for cache_flush: real commands and processes, the official checker."""

import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.core import eval_metrics
from maxtext.listeners import interface
from maxtext.mllog import cache_flush
from maxtext.mllog import mllog_listener
from maxtext.mllog import logger as mllog_logger
from maxtext.mllog import mlperf_config
from testing import compliance_checker
from testing import multiprocess
from testing import tiny_configs


def _mlperf(config):
  """The run config's MLPerf log settings."""
  return mlperf_config.MlperfConfig.from_config(config)


def _start(config, out):
  """The MLPerf listener of a single-process run of `config` in `out`."""
  return mllog_listener.start(
      _mlperf(config),
      out,
      process_index=0,
      data_parallelism=1,
      config_filename="tiny.py",
  )


class FlushCacheTest(parameterized.TestCase):

  def test_command_that_succeeds_flushes(self):
    result = cache_flush.flush_cache("true")
    self.assertEqual(result, cache_flush.FlushResult(True, "", "true"))

  @parameterized.named_parameters(
      ("exit_status", "false", "'false' exited with status 1"),
      (
          "nonexistent",
          "no_such_flush_command_x",
          "exited with status 127: .*no_such_flush_command_x.*not found",
      ),
      (
          "output_quoted",
          "echo cannot drop >&2; exit 3",
          "exited with status 3: cannot drop",
      ),
      ("killed", "kill -9 $$", "was killed by signal 9"),
  )
  def test_command_that_fails_is_not_a_flush(self, command, reason):
    result = cache_flush.flush_cache(command)
    self.assertFalse(result.flushed)
    self.assertRegex(result.reason, reason)
    self.assertEqual(result.command, command)

  def test_command_past_its_timeout_is_killed_and_not_a_flush(self):
    result = cache_flush.flush_cache("sleep 30", timeout_s=0.2)
    self.assertFalse(result.flushed)
    self.assertIn("did not finish within 0.2 s", result.reason)

  def test_command_runs_in_a_shell(self):
    marker = self.create_tempfile().full_path
    result = cache_flush.flush_cache(f"sync && echo done > {marker}")
    self.assertTrue(result.flushed, result.reason)
    with open(marker, encoding="utf-8") as f:
      self.assertEqual(f.read(), "done\n")

  def test_default_needs_linux_and_runs_nothing_elsewhere(self):
    result = cache_flush.flush_cache("", platform="darwin", euid=0)
    self.assertEqual(result.command, "")
    self.assertFalse(result.flushed)
    self.assertIn("needs Linux (this is darwin)", result.reason)

  def test_default_needs_root(self):
    result = cache_flush.flush_cache("", platform="linux", euid=1000)
    self.assertEqual(result.command, "")
    self.assertFalse(result.flushed)
    self.assertRegex(result.reason, "drop_caches.*needs root.*uid 1000")

  def test_default_on_this_host_reports_what_happened(self):
    # The real default: flushed as root on Linux where /proc/sys is writable;
    # anything else must come back as not flushed, with the reason.
    result = cache_flush.flush_cache()
    if result.flushed:
      self.assertEqual(result.command, cache_flush.DEFAULT_COMMAND)
      self.assertTrue(sys.platform.startswith("linux"))
      self.assertEqual(os.geteuid(), 0)
    else:
      self.assertNotEmpty(result.reason)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(TypeError, "cache_clear_command must be a str"):
      cache_flush.flush_cache(["true"])
    with self.assertRaisesRegex(ValueError, "timeout_s must be > 0, got 0"):
      cache_flush.flush_cache("true", timeout_s=0)


class AgreeTest(parameterized.TestCase):

  def _gather(self, flags):
    def allgather(value):
      self.assertEqual(np.asarray(value).shape, ())
      return np.asarray(flags)

    return allgather

  def test_flushed_when_every_process_flushed(self):
    ok = cache_flush.FlushResult(True, "", "true")
    self.assertEqual(
        cache_flush.agree(ok, allgather=self._gather([1, 1, 1])), ok
    )

  def test_a_peer_that_failed_makes_it_not_flushed(self):
    ok = cache_flush.FlushResult(True, "", "true")
    result = cache_flush.agree(ok, allgather=self._gather([1, 0, 1, 0]))
    self.assertFalse(result.flushed)
    self.assertIn("process(es) [1, 3]", result.reason)

  def test_own_failure_keeps_its_reason(self):
    failed = cache_flush.FlushResult(
        False, "'false' exited with status 1", "false"
    )
    self.assertEqual(
        cache_flush.agree(failed, allgather=self._gather([0, 1])), failed
    )

  def test_one_process_needs_no_collective(self):
    ok = cache_flush.FlushResult(True, "", "true")
    self.assertEqual(cache_flush.agree(ok), ok)


# Each process flushes with its own command, twice: first every process with
# `true`, then with the command its argument names; prints both outcomes.
_PROCESS_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    jax.distributed.initialize(coordinator_address=sys.argv[1],
                               num_processes=2, process_id=int(sys.argv[2]),
                               initialization_timeout=120)
    from maxtext.mllog import cache_flush
    first = cache_flush.flush_all_hosts("true")
    second = cache_flush.flush_all_hosts(sys.argv[3])
    print("RESULT " + json.dumps([first.flushed, second.flushed,
                                  second.reason]), flush=True)
""")


class MultiProcessTest(absltest.TestCase):

  def test_every_process_learns_that_one_host_failed(self):
    address = f"127.0.0.1:{multiprocess.free_port()}"
    commands = ["true", "false"]
    procs = [
        # Both must run at once (no `with`); the finally below reaps them.
        subprocess.Popen(  # pylint: disable=consider-using-with
            [
                sys.executable,
                "-c",
                _PROCESS_SCRIPT,
                address,
                str(i),
                commands[i],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            env=multiprocess.child_env(),
        )
        for i in range(2)
    ]
    outputs = []
    try:
      for proc in procs:
        out, err = proc.communicate(timeout=240)
        self.assertEqual(proc.returncode, 0, err[-3000:])
        outputs.append((out, err))
    finally:
      for proc in procs:
        if proc.poll() is None:
          proc.kill()
          proc.wait()
    results = [
        json.loads(
            next(
                line[len("RESULT ") :]
                for line in out.splitlines()
                if line.startswith("RESULT ")
            )
        )
        for out, _ in outputs
    ]
    # All agree on True for `true`, and on False once process 1 failed.
    self.assertEqual([r[:2] for r in results], [[True, False], [True, False]])
    self.assertIn("process(es) [1]", results[0][2])
    self.assertIn("'false' exited with status 1", results[1][2])
    self.assertIn("not flushed on this host", outputs[1][1])


class ListenerStartTest(parameterized.TestCase):
  """`listener.start` logs cache_clear as the flush turned out."""

  def _log(self, command, **overrides):
    """Logs a short successful run through the listener; returns the log."""
    out = self.create_tempdir().full_path
    config = tiny_configs.tiny_config(
        out, cache_clear_command=command, **overrides
    )
    listener = _start(config, out)
    listener.on_run_start(interface.RunStart(0, 0))
    samples = 3 * config.global_batch_size
    listener.on_eval_start(2, samples)
    listener.on_eval(
        interface.EvalRecord(
            step=2,
            metrics={
                "loss": eval_metrics.EvalMetric(
                    0.5, eval_metrics.Direction.LOWER_IS_BETTER
                )
            },
            target_metric="loss",
            eval_time=0.1,
            samples=samples,
            target_reached=True,
            continues=False,
        )
    )
    listener.on_run_end(
        interface.RunEnd(interface.RunOutcome.SUCCESS, 3, samples)
    )
    listener.close()
    return listener.logger.path

  def test_successful_command_logs_true(self):
    path = self._log("true")
    events = mllog_logger.read_events(path)
    self.assertEqual(
        (events[0]["key"], events[0]["value"]), ("cache_clear", True)
    )
    self.assertTrue(compliance_checker.run_checker(path).passed)

  @parameterized.named_parameters(
      ("failing", "false", "'false' exited with status 1"),
      ("nonexistent", "no_such_flush_command_x", "status 127"),
  )
  def test_failed_command_logs_false_says_why_and_passes_the_checker(
      self, command, reason
  ):
    with self.assertLogs(level="WARNING") as logs:
      path = self._log(command)
    events = mllog_logger.read_events(path)
    self.assertEqual(
        (events[0]["key"], events[0]["value"]), ("cache_clear", False)
    )
    self.assertTrue(
        any(
            "cache_clear is logged False" in line and reason in line
            for line in logs.output
        ),
        logs.output,
    )
    # The official checker accepts an honest False.
    result = compliance_checker.run_checker(path)
    self.assertTrue(result.passed, result.output + "\n".join(result.messages))

  def test_mllog_off_runs_no_command(self):
    out = self.create_tempdir().full_path
    marker = os.path.join(out, "flushed")
    config = tiny_configs.tiny_config(
        out, enable_mllog=False, cache_clear_command=f"touch {marker}"
    )
    listener = _start(config, out)
    listener.close()
    self.assertFalse(os.path.exists(marker))
    self.assertFalse(listener.logger.enabled)


if __name__ == "__main__":
  absltest.main()
