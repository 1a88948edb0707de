"""`share.from_lead` across two real processes of one jax.distributed job
(one CPU device each): both hold process 0's episodes, tool answers and
rewards, and process 0's own value; only process 0 ran environments."""

from absl.testing import absltest

from testing import multiprocess

_TIMEOUT_S = 300


class ShareTest(absltest.TestCase):

  def test_every_process_gets_process_0s_episodes(self):
    held = multiprocess.run_children(
        "testing.share_child", self.create_tempdir().full_path, _TIMEOUT_S
    )
    lead, other = held[0], held[1]
    self.assertEqual((lead["process"], other["process"]), (0, 1))
    self.assertNotEqual(lead["pid"], other["pid"])
    # Environments ran on process 0 only.
    self.assertEqual(lead["environments_made"], 2)
    self.assertEqual(other["environments_made"], 0)
    # Both hold process 0's episodes: its tool answers (its pid) in the
    # tokens, its rewards.
    self.assertEqual(lead["episodes"], other["episodes"])
    self.assertEqual(lead["texts"], other["texts"])
    for episode, text in zip(lead["episodes"], lead["texts"]):
      self.assertEqual(episode["env_reward"], 0.25)
      self.assertEqual(episode["tool_calls"], 1)
      self.assertTrue(episode["done"])
      self.assertIn(f"process 0 pid {lead['pid']}", text)
      self.assertNotIn("process 1", text)
    # And process 0's own value, whole.
    for holder in held:
      self.assertEqual(
          holder["shared"],
          {"process": 0, "pid": lead["pid"], "text": "é" * 70000},
      )


if __name__ == "__main__":
  absltest.main()
