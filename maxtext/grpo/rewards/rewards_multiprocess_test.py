"""`rewards.score` across two real processes of one jax.distributed job
(one CPU device each): the functions run on process 0 alone, and every
process gets its values, or its error line."""

from absl.testing import absltest

from testing import multiprocess

_TIMEOUT_S = 300


class RewardsMultiProcessTest(absltest.TestCase):

  def test_rewards_run_once_per_job(self):
    held = multiprocess.run_children(
        "testing.rewards_child", self.create_tempdir().full_path, _TIMEOUT_S
    )
    lead, other = held[0], held[1]
    # Process 0 called the function on the 4 completions; process 1 never.
    self.assertEqual((lead["calls"], other["calls"]), (4, 0))
    # Its values (process index 0 + the completion's length), weighted 2,
    # on both.
    for holder in held:
      self.assertEqual(holder["per_function"], {"where_called": [1, 2, 3, 0]})
      self.assertEqual(holder["total"], [2, 4, 6, 0])
    # Process 0's failure, its line (its pid) on both.
    self.assertIsNotNone(lead["failure"])
    self.assertEqual(lead["failure"], other["failure"])
    self.assertRegex(
        lead["failure"],
        "^reward function testing.hostile_rewards:fails_on_process_0 on "
        r"prompt 0 \(sample 0\) raised RuntimeError: judge unreachable from "
        r"pid \d+",
    )


if __name__ == "__main__":
  absltest.main()
