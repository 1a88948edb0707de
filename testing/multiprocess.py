"""Launches real train_main (or grpo_main) processes that form one
jax.distributed job.

Each process gets `--config.num_processes=N --config.process_id=i
--config.coordinator_address=127.0.0.1:PORT` plus the caller's flags, its own
stdout/stderr files, and an environment without Bazel's test-sharding
variables. Under Bazel the binary is the `//maxtext:train_main` runfile; run
directly, it is `python -m maxtext.train_main` with the caller's sys.path (see
`testing.runfiles.train_main_command`).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

from testing import runfiles


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(extra: Optional[dict] = None) -> dict:
  """The environment of a child: ours, with our import path, JAX on the CPU."""
  env = dict(os.environ)
  for key in (
      "TEST_SHARD_INDEX",
      "TEST_TOTAL_SHARDS",
      "TEST_SHARD_STATUS_FILE",
      "XML_OUTPUT_FILE",
      "TEST_PREMATURE_EXIT_FILE",
  ):
    env.pop(key, None)
  env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.update(extra or {})
  return env


class Process:
  """One launched process and its output files."""

  def __init__(
      self, popen: subprocess.Popen, stdout_path: str, stderr_path: str
  ):
    self.popen = popen
    self.stdout_path = stdout_path
    self.stderr_path = stderr_path

  def wait(self, timeout: float) -> int:
    return self.popen.wait(timeout=timeout)

  def signal(self, sig=signal.SIGTERM) -> None:
    self.popen.send_signal(sig)

  def output(self) -> str:
    """stdout then stderr, as text."""
    text = []
    for path in (self.stdout_path, self.stderr_path):
      with open(path, errors="replace", encoding="utf-8") as f:
        text.append(f.read())
    return "\n".join(text)

  def kill(self) -> None:
    if self.popen.poll() is None:
      self.popen.kill()
      self.popen.wait(timeout=30)


def launch(
    num_processes: int,
    flags: Sequence[str],
    log_dir: str,
    *,
    process_ids: Optional[Sequence[int]] = None,
    port: Optional[int] = None,
    command: Optional[Sequence[str]] = None,
    env: Optional[dict] = None,
) -> list[Process]:
  """Starts train_main processes of one job (all unless process_ids says).

  Args:
    num_processes: the job's process count.
    flags: train_main flags shared by every process.
    log_dir: where each process's stdout/stderr files go.
    process_ids: which processes to start (default: all), e.g. [0] to start one
      whose peer never arrives.
    port: the coordinator's port (default: a free one).
    command: the binary's command (default: train_main's; e.g.
      `runfiles.binary_command("maxtext/grpo_main")`).
    env: variables each process gets on top of `child_env`'s (e.g.
      XLA_FLAGS giving each several CPU devices).

  Returns:
    The started processes, in process_ids order.
  """
  port = port or free_port()
  os.makedirs(log_dir, exist_ok=True)
  processes = []
  for i in (range(num_processes) if process_ids is None else process_ids):
    argv = (
        list(command or runfiles.train_main_command())
        + list(flags)
        + [
            f"--config.num_processes={num_processes}",
            f"--config.process_id={i}",
            f"--config.coordinator_address=127.0.0.1:{port}",
        ]
    )
    out = os.path.join(log_dir, f"process_{i}.out")
    err = os.path.join(log_dir, f"process_{i}.err")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
      # The process outlives this call: the returned Process waits for it.
      popen = subprocess.Popen(  # pylint: disable=consider-using-with
          argv,
          stdout=stdout,
          stderr=stderr,
          stdin=subprocess.DEVNULL,
          env=child_env(env),
      )
    processes.append(Process(popen, out, err))
  return processes


def wait_all(processes: Sequence[Process], timeout: float) -> list[int]:
  """Waits for every process (killing all on timeout); returns exit codes."""
  deadline = time.monotonic() + timeout
  codes = []
  try:
    for p in processes:
      codes.append(p.wait(max(1.0, deadline - time.monotonic())))
  except subprocess.TimeoutExpired:
    for p in processes:
      p.kill()
    raise
  return codes


def run_children(
    module: str, output_dir: str, timeout: float, num_processes: int = 2
) -> list:
  """Runs `python -m module --output=output_dir` as every process of one job
  (a `job_child`) and returns what each wrote, in process order.

  Raises:
    AssertionError: a process exited with a non-zero code (with the ends of
      every process's output).
  """
  processes = launch(
      num_processes,
      [f"--output={output_dir}"],
      os.path.join(output_dir, "logs"),
      command=[sys.executable, "-m", module],
  )
  codes = wait_all(processes, timeout)
  if any(codes):
    raise AssertionError(
        f"{module} exited with {codes}:\n"
        + "\n".join(p.output()[-3000:] for p in processes)
    )
  held = []
  for index in range(num_processes):
    path = os.path.join(output_dir, f"process_{index}.json")
    with open(path, encoding="utf-8") as f:
      held.append(json.load(f))
  return held
