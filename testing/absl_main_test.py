"""absl_main.run: flags parsed per call, output captured, the exit status."""

import sys

from absl import flags
from absl.testing import absltest

from testing import absl_main

_NAME = flags.DEFINE_string("absl_main_test_name", "nobody", "Who to greet.")
_LOUD = flags.DEFINE_bool("absl_main_test_loud", False, "Shout.")


def _main(argv):
  if len(argv) > 1:
    print(f"unexpected {argv[1:]}", file=sys.stderr)
    sys.exit(2)
  greeting = f"hello {_NAME.value}"
  print(greeting.upper() if _LOUD.value else greeting)


class AbslMainTest(absltest.TestCase):

  def test_output_status_and_flags_reset_between_calls(self):
    module = sys.modules[__name__]
    self.assertEqual(
        absl_main.run(
            module,
            _main,
            ["--absl_main_test_name=ann", "--absl_main_test_loud"],
        ),
        (0, "HELLO ANN\n", ""),
    )
    # Neither flag carries over from the call before.
    self.assertEqual(
        absl_main.run(module, _main, []), (0, "hello nobody\n", "")
    )
    self.assertEqual(
        absl_main.run(module, _main, ["extra"]),
        (2, "", "unexpected ['extra']\n"),
    )

  def test_a_returned_status_is_the_exit_status(self):
    # absl.app.run exits with what main returns.
    module = sys.modules[__name__]
    self.assertEqual(absl_main.run(module, lambda argv: 3, []), (3, "", ""))

  def test_sys_argv_is_the_command_line_during_main(self):
    # ml_collections' config flags read their overrides from sys.argv.
    module = sys.modules[__name__]
    before = list(sys.argv)
    seen = []
    absl_main.run(
        module,
        lambda argv: seen.append(list(sys.argv)),
        ["--absl_main_test_name=ann"],
    )
    self.assertEqual(seen, [[__name__, "--absl_main_test_name=ann"]])
    self.assertEqual(sys.argv, before)


if __name__ == "__main__":
  absltest.main()
