"""decode_host_profile on a tiny model: what it counts per decode call.

Counts, not times: the phases' seconds are only checked to be there.
"""

from absl.testing import absltest
import jax
import ml_collections
import numpy as np

from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.model import transformer
from testing import tiny_configs
from tools.benchmarks import decode_host_profile


def _rollout(refill: int):
  """A warm rollout of 6 contexts x 1 sample in 2 slots: slots refilled
  several times, a freed slot whose queue is empty waiting for the next
  decode call to start a context prefilled (ahead, while the call ran)
  for it."""
  config = ml_collections.FrozenConfigDict(
      tiny_configs.model_config(max_sequence_length=64)
  )
  params = transformer.init_params(config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(3)
  prompts = [
      [int(i) for i in rng.integers(0, 32, size=n)] for n in (5, 8, 3, 6, 4, 7)
  ]
  engine = paged_decoder.EngineOptions(
      num_slots=2, page_size=4, chunk=16, refill=refill
  )

  def rollout():
    return paged_decoder.generate(
        params,
        config,
        prompts,
        sampling.SamplingOptions(max_new_tokens=12, num_samples=1),
        max_new_tokens=[12, 3, 7, 1, 9, 5],
        engine=engine,
    )

  rollout()
  return rollout


class DecodeHostProfileTest(absltest.TestCase):

  def test_counts_per_decode_call(self):
    got = decode_host_profile.profile(_rollout(refill=1))
    calls = got.decode_calls
    self.assertEqual(calls, got.result.decode_calls)
    self.assertGreater(calls, 2)
    # Warm: nothing compiles.
    self.assertEqual(got.compiles, 0)
    self.assertEqual(got.launches["jit(_decode)"], calls)
    self.assertEqual(got.launches["jit(_prefill)"], got.result.prefill_calls)
    # A call's results come back as one array; nothing else is read.
    self.assertEqual(got.to_host, calls)
    # Placed: one array a decode call, three a prefill call (ids, bounds,
    # tables), one a stage call (the ready rows), and once a rollout the
    # draw's six values and the seed its key's program is given. Nothing
    # is launched to start a continuation: the decode call does.
    self.assertEqual(got.launches["jit(_stage)"], got.result.prefill_calls)
    self.assertEqual(got.to_device, calls + 4 * got.result.prefill_calls + 7)
    self.assertEqual(set(got.wall), set(decode_host_profile.PHASES))
    self.assertGreater(got.wall["wait"], 0)

  def test_fewer_calls_fewer_transfers(self):
    each = decode_host_profile.profile(_rollout(refill=1))
    fewer = decode_host_profile.profile(_rollout(refill=2))
    self.assertLess(fewer.decode_calls, each.decode_calls)
    self.assertEqual(
        each.to_host - fewer.to_host, each.decode_calls - fewer.decode_calls
    )
    np.testing.assert_array_equal(fewer.result.ids, each.result.ids)

  def test_report_ends_with_the_counts_line(self):
    got = decode_host_profile.profile(_rollout(refill=1))
    lines = decode_host_profile.report(got)
    self.assertLen(lines, 3 + len(decode_host_profile.PHASES))
    self.assertRegex(
        lines[-1],
        r"^host profile: launches=\d+\.\d\d to_device=\d+\.\d\d "
        r"to_host=1\.00 compiles=0 host_cpu_us=\d+ \(per decode call\)$",
    )


if __name__ == "__main__":
  absltest.main()
