"""Runs the decode_bench binary on a tiny model: its table and closing line.

Times are not checked (tests never assert on speed); what is checked is that
both samplers run, generate the tokens the table says, agree on their ids,
and that the last line is the one other tools parse.
"""

import re

from absl.testing import absltest

from testing import runfiles

_LAST_LINE = re.compile(r"^decode_bench: speedup=(\d+\.\d)$")
_LONGTAIL_LINE = re.compile(
    r"^decode_bench: continuous_speedup=(\d+\.\d) pages_used=(\d+) "
    r"prefill_passes=(\d+)/(\d+)$"
)
# A tiny model under configs/decode_bench.py's field names.
_TINY = (
    "--config.vocab_size=64",
    "--config.emb_dim=32",
    "--config.num_layers=2",
    "--config.num_heads=4",
    "--config.num_kv_heads=2",
    "--config.head_dim=8",
    "--config.mlp_dim=64",
    "--config.max_sequence_length=32",
)
# _TINY's parameters a decode step reads: per layer two norm scales (32
# each), wq and wo 32 x 32, wk and wv 32 x 16, the MLP's three 32 x 64; the
# final norm and the 32 x 64 output projection (the input embedding is read
# one row per row). float32, the config's compute dtype.
_WEIGHT_BYTES = (
    2 * (2 * 32 + 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64) + 32 + 32 * 64
) * 4
# 2 layers x (k, v) of 2 heads of 8 float32.
_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4
# A longtail run small enough for a test: 2 prompts x 4 samples in 3 slots.
_TINY_LONGTAIL = (
    "--lengths=longtail",
    "--prompts=2",
    "--num_generations=4",
    "--prompt_len=5",
    "--mean_length=4",
    "--max_length=12",
    "--slots=3",
    "--page_size=4",
)
_STEP_BYTES = re.compile(
    r"^(paged|cached) decode step reads: (\d+) weight bytes \+ (\d+) cache "
    r"bytes \+ (\d+) state bytes = (\d+) bytes \(mean of (\d+) steps\)$"
)
_NO_LIMIT = re.compile(
    r"^(paged|cached) bandwidth limit: unknown for 'cpu'; measured "
    r"(\d+\.\d{3}) ms a step$"
)


def _run(*args):
  return runfiles.run_binary(
      "tools/benchmarks/decode_bench", list(_TINY + args), timeout_s=600
  )


class DecodeBenchTest(absltest.TestCase):

  def check_step(self, lines, decoder: str, steps: int, seconds: float):
    """The decoder's step lines: its weights, its steps, no known limit on
    the CPU and the measured step = the timed seconds over the steps."""
    step = [m for m in map(_STEP_BYTES.match, lines) if m]
    self.assertLen(step, 1, lines)
    name, weights, cache, states, total, count = step[0].groups()
    self.assertEqual(name, decoder)
    self.assertEqual(int(weights), _WEIGHT_BYTES)
    self.assertEqual(states, "0")
    # The total is summed unrounded: each part rounds by up to half a byte.
    self.assertAlmostEqual(int(total), int(weights) + int(cache), delta=1)
    self.assertEqual(int(count), steps)
    limit = [m for m in map(_NO_LIMIT.match, lines) if m]
    self.assertLen(limit, 1, lines)
    self.assertEqual(limit[0].group(1), decoder)
    # The seconds are printed to 1 ms, the step to 1 microsecond.
    self.assertAlmostEqual(
        float(limit[0].group(2)),
        1e3 * seconds / steps,
        delta=0.5 / steps + 0.0006,
    )

  def test_longtail_compares_the_static_and_paged_decoders(self):
    proc = _run(*_TINY_LONGTAIL)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertIn("2 prompts of 5 x G=4", lines[0])
    self.assertIn("geometric mean 4 capped at 12", lines[0])
    rows = {l.split()[0]: l.split()[1:] for l in lines[2:4]}
    self.assertEqual(sorted(rows), ["paged", "static"])
    # The same requests: the same useful tokens; every request's ids agree.
    self.assertEqual(rows["static"][0], rows["paged"][0])
    self.assertIn(
        "same ids: 8/8 requests; agree within float32 rounding: 8/8", lines
    )
    steps = int(re.match(r"^paged: (\d+) decode steps", lines[4]).group(1))
    self.check_step(lines, "paged", steps, float(rows["paged"][1]))
    # The mean cache of a step: every row-step (a useful token) attends
    # over 6 (prompt 5, first id) to 17 (prompt 5 + 12 ids) positions.
    cache = int(_STEP_BYTES.match(lines[6]).group(3))
    useful = int(rows["paged"][0])
    self.assertBetween(
        cache,
        _BYTES_PER_TOKEN * 6 * useful / steps - 1,
        _BYTES_PER_TOKEN * 17 * useful / steps + 1,
    )
    self.assertEqual(rows["static"][6], "8")  # prefilled rows: P x G
    self.assertEqual(rows["paged"][6], "2")  # one prefill per prompt
    match = _LONGTAIL_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    static_s, paged_s = float(rows["static"][1]), float(rows["paged"][1])
    # The speedup is printed to 0.1 from the unrounded seconds, the seconds
    # to 1 ms: the ratio of the printed seconds may differ by both roundings
    # (a tiny run's seconds are a few ms).
    ratio = static_s / paged_s
    rounding = ratio * (0.0005 / static_s + 0.0005 / paged_s)
    self.assertAlmostEqual(
        float(match.group(1)), ratio, delta=0.051 + 1.01 * rounding
    )
    self.assertEqual(match.group(3, 4), ("2", "8"))
    # 2 layers x (k, v) of 2 heads of 8 float32 = 256 bytes per token; a
    # page holds 4.
    self.assertEqual(int(rows["paged"][5]), int(match.group(2)) * 4 * 256)
    self.assertLessEqual(int(rows["paged"][5]), int(rows["paged"][4]))

  def test_host_profile_counts_a_decode_calls_work(self):
    proc = _run(*_TINY_LONGTAIL, "--host_profile")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    calls = int(
        re.match(r"^paged: \d+ decode steps in (\d+) calls", lines[4])[1]
    )
    profile = [l for l in lines if l.startswith("paged host profile")]
    self.assertLen(profile, 2, lines)
    self.assertIn(f"paged host profile: {calls} decode calls", profile[0])
    # One decode program and one transfer of its results a call; warm
    # programs, nothing compiled.
    self.assertIn("jit(_decode) 1.00", proc.stdout)
    self.assertRegex(
        profile[1],
        r"^paged host profile: launches=\d+\.\d\d to_device=\d+\.\d\d "
        r"to_host=1\.00 compiles=0 host_cpu_us=\d+ \(per decode call\)$",
    )
    self.assertRegex(lines[-1], _LONGTAIL_LINE)

  def test_runs_and_reports(self):
    proc = _run(
        "--batch=2", "--prompt_len=5", "--new_tokens=9", "--windowed_tokens=3"
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    lines = proc.stdout.strip().splitlines()
    self.assertIn("max_sequence_length 32, batch 2, prompt 5", lines[0])
    rows = {l.split()[0]: l.split()[1:] for l in lines[2:4]}
    self.assertEqual(sorted(rows), ["cached", "windowed"])
    self.assertEqual(rows["cached"][0], "18")  # 2 rows x 9 tokens
    self.assertEqual(rows["windowed"][0], "6")
    for name, row in rows.items():
      seconds, rate, compile_s = map(float, row[1:4])
      self.assertGreater(seconds, 0, name)
      # tokens / rate is the time, up to the 3 decimals printed.
      self.assertAlmostEqual(
          int(row[0]) / rate, seconds, delta=0.0006, msg=name
      )
      self.assertGreater(compile_s, 0, name)
    # 16 positions (the smallest bucket) x 2 rows x 2 layers x (k, v) of
    # 2 heads of 8 float32.
    self.assertEqual(rows["cached"][4], str(16 * 2 * 2 * 2 * 2 * 8 * 4))
    self.assertIn(
        "same ids: 2/2 rows, the first 3 tokens; agree within float32 "
        "rounding: 2/2",
        lines,
    )
    # 9 steps of 2 rows after 5-id prompts: step j attends over 5 + j
    # positions.
    cache = _BYTES_PER_TOKEN * 2 * sum(5 + j for j in range(1, 10)) // 9
    self.assertIn(
        f"cached decode step reads: {_WEIGHT_BYTES} weight bytes + {cache} "
        f"cache bytes + 0 state bytes = {_WEIGHT_BYTES + cache} bytes (mean "
        "of 9 steps)",
        lines,
    )
    self.check_step(lines, "cached", 9, float(rows["cached"][1]))
    self.assertIn("cache: 16 positions x 2 rows, 256 bytes per token", lines)
    match = _LAST_LINE.match(lines[-1])
    self.assertIsNotNone(match, lines[-1])
    speedup = float(rows["cached"][2]) / float(rows["windowed"][2])
    self.assertAlmostEqual(float(match.group(1)), speedup, delta=0.051)

  def test_mla_reports_its_cache_against_grouped_query_attention(self):
    proc = _run(
        "--batch=1",
        "--prompt_len=2",
        "--new_tokens=2",
        "--windowed_tokens=1",
        "--config.attention_type=mla",
        "--config.q_lora_rank=0",
        "--config.kv_lora_rank=12",
        "--config.qk_nope_head_dim=8",
        "--config.qk_rope_head_dim=4",
        "--config.v_head_dim=6",
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    # 2 layers x (12 + 4) float32 against 4 heads x (8 + 4 + 6).
    self.assertIn(
        "cache: 16 positions x 1 rows, 128 bytes per token (576 for "
        "grouped-query attention of the same width)",
        proc.stdout,
    )

  def test_a_request_past_the_context_is_a_usage_error(self):
    proc = _run("--prompt_len=30", "--new_tokens=8")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn(
        "--prompt_len=30 + --new_tokens=8 exceeds max_sequence_length 32",
        proc.stderr,
    )

  def test_a_count_below_one_is_one_line(self):
    proc = _run("--lengths=longtail", "--refill=0")
    self.assertEqual(proc.returncode, 2)
    self.assertEqual(
        proc.stderr.strip().splitlines()[-1],
        "decode_bench: error: --prompts, --num_generations, --prompt_len, "
        "--max_length, --mean_length, --refill must be >= 1",
    )
    # Not absl's usage text (the flags' help) before it.
    self.assertNotIn("most decode steps one paged decode call", proc.stderr)

  def test_the_kernel_where_it_cannot_run_is_a_usage_error(self):
    proc = _run("--lengths=longtail", "--attention=kernel")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--attention=kernel: ", proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  absltest.main()
