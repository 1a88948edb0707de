"""What every tool binary does with its command line and the user's mistakes.

Tools take flags only: a positional argument is a usage error, and so is a
missing flag the tool cannot run without (absl prints the usage). A mistake
the user can fix, raised by the tool's own checks as a ValueError (a bad
path, option or config value, each named), is one line on stderr,
`<tool>: error: <message>`, with exit status 2 and no traceback; any other
error keeps its traceback.

    def main(argv):
      command_line.check(argv, _RUN_DIR)
      with command_line.user_errors("generate"):
        _generate()
"""

from collections.abc import Iterator
import contextlib
import sys

from absl import app
from absl import flags

USER_ERROR_STATUS = 2


def check(argv: list[str], *required: flags.FlagHolder) -> None:
  """Refuses positional arguments and missing `required` flags.

  Args:
    argv: the arguments absl left after the flags, program name first.
    *required: flags that must have a value (not None, not empty).

  Raises:
    app.UsageError: naming the extra arguments or the missing flag.
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for flag in required:
    if flag.value is None or flag.value == "":
      raise app.UsageError(f"--{flag.name} is required")


@contextlib.contextmanager
def user_errors(
    program: str, errors: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
  """Turns `errors` raised inside into one line and exit status 2.

  Args:
    program: the tool's name, the line's prefix.
    errors: the exception types that mean the user's mistake.

  Yields:
    Nothing; the body runs inside.

  Raises:
    SystemExit: with USER_ERROR_STATUS, after printing the line.
  """
  try:
    yield
  except errors as e:
    print(f"{program}: error: {e}", file=sys.stderr)
    sys.exit(USER_ERROR_STATUS)
