r"""Does GRPO add held-out accuracy on the math task beyond more SFT?

Runs the whole experiment of `tools/math_heldout_lib.py` in one process
(docs/grpo.md, "A held-out gain from GRPO: the experiment"): writes the math
task's demonstrations, then for each seed SFT from the seed, GRPO from the
SFT checkpoint, and the control (SFT continued for as many samples), each
arm evaluated as the benchmark evaluates (the GRPO config's held-out eval).
With --sft_steps=0 the first seed's SFT run is the config's length and the
SFT length is the first of its checkpoints whose held-out pass@1 reaches
--target_pass_at_1 (found by bisection); the other seeds' SFT runs stop
there. Every run shares one JAX compilation cache, so a program compiles
once for the experiment.

On one TPU v5e chip, from the source tree:

  python3 tools/math_heldout.py --output_dir=/tmp/math_heldout_out \
      --sft_config=maxtext/configs/sft_math_small.py \
      --grpo_config=maxtext/configs/grpo_math_small.py --time_limit_s=480

or `tools/bazel run //tools:math_heldout -- ...` (relative paths resolve
against the runfiles tree there: give absolute ones). --sft_config.<field>
and --grpo_config.<field> override either config's fields
(--sft_config.steps=400, --grpo_config.learning_rate=2e-4).

--output_dir receives at most four files: summary.md (the table and the
verdict, also printed at the end), summary.json (every figure, rewritten
after each run, so a failed experiment keeps what it measured),
math_heldout.log (the whole log) and runs.tar.gz (every run's
metrics.jsonl and config.json). The runs themselves (checkpoints included)
go to --work_dir, which must not hold an earlier experiment.
"""

import dataclasses
import importlib
import json
import logging as std_logging
import math
import os
import tarfile
import tempfile
import time
from typing import Optional

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from maxtext import workloads
from maxtext.config import config_lib
from maxtext.core import caller_paths
from maxtext.env import demonstrations
from maxtext.env import tasks
from maxtext.metrics import jsonl
from tools import command_line
from tools import math_heldout_lib as lib

_PROGRAM = "math_heldout"
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    None,
    "Directory for the summary, the log and the runs' "
    "metrics (at most four files).",
)
_WORK_DIR = flags.DEFINE_string(
    "work_dir",
    os.path.join(tempfile.gettempdir(), "math_heldout"),
    "Directory for the runs, the demonstrations and the compilation cache; "
    "must be empty or absent.",
)
_SFT_CONFIG = config_flags.DEFINE_config_file(
    "sft_config",
    None,
    "The SFT config file (the SFT phase and the control).",
    lock_config=True,
)
_GRPO_CONFIG = config_flags.DEFINE_config_file(
    "grpo_config",
    None,
    "The GRPO config file (GRPO and every evaluation).",
    lock_config=True,
)
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "The seeds.")
_SFT_STEPS = flags.DEFINE_integer(
    "sft_steps",
    0,
    "SFT steps of every seed; 0 = found from the first seed's SFT run "
    "(--target_pass_at_1).",
)
_DEMONSTRATIONS = flags.DEFINE_integer(
    "demonstrations",
    12800,
    "Training demonstrations written (every SFT run and the controls read "
    "them, epoch after epoch).",
)
_TIME_LIMIT_S = flags.DEFINE_float(
    "time_limit_s",
    0.0,
    "Seconds the experiment may take (0 = no limit): a seed that would end "
    "past it, judging by the seed before, is left out (the summary says so).",
)
_TARGET = flags.DEFINE_float(
    "target_pass_at_1",
    0.3,
    "With --sft_steps=0: the held-out pass@1 the SFT checkpoint must reach.",
)

# The GRPO runs' training statistics kept (train records), and those the
# table shows: the training reward over the first and last _WINDOW steps,
# the share of groups whose rewards are all equal (they teach nothing).
_TRAINING_KEYS = ("rewards/mean", "frac_reward_zero_std")
_TABLE_KEYS = (
    "rewards/mean first",
    "rewards/mean last",
    "frac_reward_zero_std",
)
_WINDOW = 10


def _parse_flags(argv):
  return app.parse_flags_with_usage(
      caller_paths.resolve_config_args(argv, os.environ)
  )


def _seeds() -> list[int]:
  try:
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError:
    raise ValueError(
        f"--seeds={','.join(_SEEDS.value)}: not integers"
    ) from None
  if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
    raise ValueError(f"--seeds={seeds}: give distinct seeds >= 0")
  return seeds


def _work_places() -> lib.Places:
  work = caller_paths.resolve_local_path(_WORK_DIR.value)
  if os.path.isdir(work) and os.listdir(work):
    raise ValueError(
        f"--work_dir={work} is not empty: it holds an earlier experiment's "
        "runs; give another directory or remove it"
    )
  return lib.Places(
      runs=os.path.join(work, "runs"),
      demos=os.path.join(work, "demos"),
      cache=os.path.join(work, "jax_cache"),
  )


class _Experiment:
  """The experiment's runs, in order, and what they measured."""

  def __init__(self, places: lib.Places, output_dir: str):
    self.sft_config = _SFT_CONFIG.value
    self.grpo_config = _GRPO_CONFIG.value
    self.places = places
    self.output_dir = output_dir
    self.seeds = _seeds()
    self.control_steps = lib.control_steps(self.grpo_config, self.sft_config)
    self.record = {
        "seeds": self.seeds,
        "grpo_steps": self.grpo_config.steps,
        "grpo_samples": lib.grpo_samples(
            self.grpo_config.steps,
            self.grpo_config.global_batch_size,
            self.grpo_config.grpo_num_iterations,
        ),
        "control_steps": self.control_steps,
        "metric": self.grpo_config.grpo_eval_target_metric,
        "runs": {},
        "seeds_done": [],
    }
    self.results: list[lib.SeedResult] = []

  def check(self) -> None:
    """Every run's config, validated before anything runs (the checkpoints
    they start from are placeholders here); the GRPO config's reward
    functions import.

    Raises:
      ValueError: one line naming the field and the value.
    """
    if _DEMONSTRATIONS.value < 1 or _SFT_STEPS.value < 0:
      raise ValueError(
          f"--demonstrations={_DEMONSTRATIONS.value} and --sft_steps="
          f"{_SFT_STEPS.value}: give at least 1 demonstration and steps >= 0"
      )
    start = os.path.join(self.places.runs, "checkpoints")
    steps = _SFT_STEPS.value or self.sft_config.steps
    runs = {
        "SFT": lib.sft_run(
            self.sft_config, self.places, 0, steps, steps, probed=True
        ),
        "control": lib.control_run(
            self.sft_config, self.places, 0, start, self.control_steps
        ),
        "eval": lib.eval_run(self.grpo_config, self.places, "eval", 0, start),
    }
    for name, config in runs.items():
      try:
        config_lib.validate(config)
      except ValueError as e:
        raise ValueError(f"the {name} runs' config: {e}") from None
    _check_verifier()
    lib.check_full_length(self.sft_config, self.grpo_config)
    if not _SFT_STEPS.value:
      lib.check_keeps_candidates(self.sft_config)
    lib.check_same_model(self.sft_config, self.grpo_config)
    workloads.check(self.grpo_config)

  def _say(self, message: str) -> None:
    logging.info("%s: %s", _PROGRAM, message)

  def _save(self) -> None:
    path = os.path.join(self.output_dir, "summary.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(self.record, f, indent=1)
    os.replace(path + ".tmp", path)

  def _train(self, config, what: str):
    """One run through the loop; its time and evaluations are recorded."""
    start = time.monotonic()
    result = workloads.run(config, config_filename=f"{_PROGRAM}:{what}")
    seconds = time.monotonic() - start
    if result.final_step != config.steps:
      raise RuntimeError(
          f"run {config.run_name} ended {result.status.value} after step "
          f"{result.final_step} of {config.steps}"
      )
    self.record["runs"][config.run_name] = {
        "phase": what,
        "seconds": round(seconds, 1),
        "steps": result.final_step,
        "start_eval": result.start_eval,
        "last_eval": result.last_eval,
        "eval_loss": result.last_eval_loss,
        "run_dir": result.run_dir,
    }
    self._save()
    self._say(
        f"{what} {config.run_name}: {result.final_step} steps in "
        f"{seconds:.1f} s; eval at the start {result.start_eval}, at the "
        f"end {result.last_eval or result.last_eval_loss}"
    )
    return result

  def write_demonstrations(self, num_train: int) -> None:
    """The task's demonstrations: `num_train` of training problems, and
    those of the GRPO config's held-out problems (the SFT eval set)."""
    start = time.monotonic()
    task = tasks.load(
        self.grpo_config.grpo_task, self.grpo_config.grpo_eval_prompts, 0
    )
    counts = demonstrations.write(task, self.places.demos, num_train)
    seconds = time.monotonic() - start
    self.record["demonstrations"] = dict(counts, seconds=round(seconds, 1))
    self._say(
        f"demonstrations: {counts['train']} training, {counts['eval']} "
        f"held-out in {seconds:.1f} s ({self.places.demos})"
    )

  def sft(
      self, seed: int, steps: int, schedule_steps: int, probed: bool
  ) -> str:
    """SFT of `seed` (`lib.sft_run`); its checkpoints' directory."""
    config = lib.sft_run(
        self.sft_config, self.places, seed, steps, schedule_steps, probed
    )
    result = self._train(config, "sft")
    return os.path.join(result.run_dir, "checkpoints")

  def evaluate(self, name: str, seed: int, start: str) -> dict[str, float]:
    """The held-out eval of the checkpoint `start` (a one-step GRPO run)."""
    config = lib.eval_run(self.grpo_config, self.places, name, seed, start)
    return self._train(config, "eval").start_eval

  def sft_length(self, checkpoints: str, seed: int) -> int:
    """The first checkpoint of the first seed's SFT run whose pass@1
    reaches the target (by bisection)."""
    candidates = lib.checkpoint_steps(
        self.sft_config.steps, self.sft_config.checkpoint_period
    )

    def pass_at_1(step: int) -> float:
      values = self.evaluate(
          f"probe_s{seed}_{step}", seed, os.path.join(checkpoints, str(step))
      )
      return values["pass@1"]

    chosen, probes = lib.first_reaching(candidates, pass_at_1, _TARGET.value)
    self.record["sft_probes"] = {str(k): v for k, v in sorted(probes.items())}
    self.record["sft_steps"] = chosen
    self._save()
    self._say(
        f"SFT length: {chosen} steps (held-out pass@1 of the probed "
        f"checkpoints {dict(sorted(probes.items()))}, target "
        f"{_TARGET.value})"
    )
    return chosen

  def arms(self, seed: int, start: str) -> lib.SeedResult:
    """GRPO and the control from the SFT checkpoint `start`."""
    grpo = self._train(
        lib.grpo_run(self.grpo_config, self.places, seed, start), "grpo"
    )
    control = self._train(
        lib.control_run(
            self.sft_config, self.places, seed, start, self.control_steps
        ),
        "control",
    )
    control_eval = self.evaluate(
        f"eval_control_s{seed}",
        seed,
        os.path.join(control.run_dir, "checkpoints"),
    )
    records = jsonl.read_jsonl(
        os.path.join(grpo.run_dir, jsonl.METRICS_FILENAME)
    )
    training = lib.training_summary(
        [r for r in records if r["kind"] == jsonl.TRAIN],
        _TRAINING_KEYS,
        _WINDOW,
    )
    result = lib.SeedResult(
        seed=seed,
        sft=grpo.start_eval,
        grpo=grpo.last_eval,
        control=control_eval,
        grpo_training=training,
    )
    self.record["seeds_done"].append(
        {
            "seed": seed,
            "sft": result.sft,
            "grpo": result.grpo,
            "control": result.control,
            "grpo_training": training,
        }
    )
    self._save()
    return result

  def run(self, deadline: float) -> None:
    """Every phase in order (module docstring); a seed that would end past
    `deadline` (time.monotonic()) is left out, judging by the seed before."""
    first, *others = self.seeds
    given = _SFT_STEPS.value
    longest = given or self.sft_config.steps
    self.write_demonstrations(_DEMONSTRATIONS.value)
    started = time.monotonic()
    checkpoints = self.sft(first, longest, longest, probed=not given)
    sft_seconds = time.monotonic() - started
    steps = given or self.sft_length(checkpoints, first)
    self.record["sft_steps"] = steps
    started = time.monotonic()
    self._seed_done(self.arms(first, os.path.join(checkpoints, str(steps))))
    # The first seed's SFT ran longest: an upper bound for the next ones.
    seed_seconds = sft_seconds + time.monotonic() - started
    for seed in others:
      if time.monotonic() + seed_seconds > deadline:
        left = max(0.0, deadline - time.monotonic())
        self.record["left_out"] = (
            f"seeds {others[others.index(seed):]} left out: the last seed took"
            f" {seed_seconds:.0f} s and {left:.0f} s of --time_limit_s remain"
        )
        self._say(self.record["left_out"])
        return
      started = time.monotonic()
      checkpoints = self.sft(seed, steps, longest, probed=False)
      self._seed_done(self.arms(seed, os.path.join(checkpoints, str(steps))))
      seed_seconds = time.monotonic() - started

  def _seed_done(self, result: lib.SeedResult) -> None:
    self.results.append(result)
    self.write_summary()

  def write_summary(self, total_seconds: Optional[float] = None) -> str:
    """summary.md as it stands; returns its text."""
    text = self.summary()
    if total_seconds is not None:
      text += f"\nWhole experiment: {total_seconds:.1f} s\n"
    path = os.path.join(self.output_dir, "summary.md")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    if total_seconds is not None:
      self.record["seconds"] = round(total_seconds, 1)
    self._save()
    return text

  def _plan_line(self) -> str:
    """What was trained and how it was evaluated, in one paragraph."""
    probes = self.record.get("sft_probes")
    how = (
        f" (the first checkpoint of seed {self.seeds[0]}'s SFT run with"
        f" held-out pass@1 >= {_TARGET.value}; pass@1 of the probed steps:"
        f" {probes})"
        if probes
        else ""
    )
    sft, grpo = self.sft_config, self.grpo_config
    return (
        f"SFT {self.record['sft_steps']} steps of {sft.global_batch_size}"
        f"{how}; GRPO {grpo.steps} steps of {grpo.global_batch_size}"
        f" completions ({self.record['grpo_samples']} samples); control"
        f" {self.control_steps} SFT steps of {sft.global_batch_size} (as many"
        f" samples). Eval: {grpo.grpo_eval_prompts} held-out problems x"
        f" {grpo.grpo_eval_samples_per_prompt} samples at temperature"
        f" {grpo.grpo_eval_temperature}, top-p {grpo.grpo_eval_top_p}."
    )

  def summary(self) -> str:
    """The plan, the table and the verdicts (Markdown)."""
    metrics = sorted(self.results[0].grpo)
    target = self.record["metric"]
    lines = [
        "# Held-out math: GRPO against an SFT-only control",
        "",
        self._plan_line(),
        "",
        lib.table(self.results, metrics, _TABLE_KEYS),
        "",
    ]
    self.record["verdicts"] = {}
    for metric in [target] + [m for m in metrics if m != target]:
      verdict = lib.verdict(self.results, metric)
      self.record["verdicts"][metric] = dataclasses.asdict(verdict)
      lines.append(
          ("Verdict, " if metric == target else "Also, ") + verdict.line()
      )
    if "left_out" in self.record:
      lines += ["", self.record["left_out"] + "."]
    lines += ["", "Seconds per run:", ""]
    lines += [
        f"- {name} ({run['phase']}): {run['seconds']}"
        for name, run in self.record["runs"].items()
    ]
    return "\n".join(lines) + "\n"


def _check_verifier() -> None:
  """The math task's verifier imports (the reward worker imports it only at
  the first reward, after the first SFT run).

  Raises:
    ValueError: naming the packages to install.
  """
  try:
    importlib.import_module("math_verify")
  except ImportError as e:
    raise ValueError(
        f"the math task's verifier does not import ({e}): install math-verify"
        " 0.9.0 with latex2sympy2-extended, antlr4-python3-runtime and sympy"
    ) from None


def _share_compilations() -> None:
  """Every program goes to the runs' shared compilation cache, however fast
  it compiled (JAX caches only those over a second by default)."""
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _archive_runs(runs_dir: str, output: str) -> None:
  """Every run's metrics.jsonl and config.json into one archive."""
  with tarfile.open(output, "w:gz") as tar:
    for name in sorted(os.listdir(runs_dir)):
      for filename in (jsonl.METRICS_FILENAME, "config.json"):
        path = os.path.join(runs_dir, name, filename)
        if os.path.isfile(path):
          tar.add(path, arcname=os.path.join(name, filename))


def _quiet(record: std_logging.LogRecord) -> bool:
  """Drops INFO chatter of orbax's internals (every checkpoint's steps)."""
  return record.levelno >= std_logging.WARNING or "/orbax/" not in (
      record.pathname
  )


def _log_to(path: str) -> None:
  """The whole log, on stderr and in `path`, without orbax's chatter."""
  logging.get_absl_handler().addFilter(_quiet)
  handler = std_logging.FileHandler(path, encoding="utf-8")
  handler.setFormatter(
      std_logging.Formatter("%(asctime)s %(levelname)s %(message)s")
  )
  handler.addFilter(_quiet)
  std_logging.getLogger().addHandler(handler)


def main(argv):
  command_line.check(argv, _OUTPUT_DIR, _SFT_CONFIG, _GRPO_CONFIG)
  with command_line.user_errors(_PROGRAM):
    output_dir = caller_paths.resolve_local_path(_OUTPUT_DIR.value)
    places = _work_places()
    os.makedirs(output_dir, exist_ok=True)
    experiment = _Experiment(places, output_dir)
    experiment.check()
  _log_to(os.path.join(output_dir, f"{_PROGRAM}.log"))
  _share_compilations()
  start = time.monotonic()
  limit = _TIME_LIMIT_S.value
  try:
    experiment.run(start + limit if limit > 0 else math.inf)
  finally:
    if os.path.isdir(places.runs):
      _archive_runs(places.runs, os.path.join(output_dir, "runs.tar.gz"))
  print(experiment.write_summary(time.monotonic() - start), flush=True)
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
