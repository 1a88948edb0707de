"""Reading the text a child process printed, in tests."""

from typing import Optional


def one_line_starting(
    text: str, prefix: str, context: Optional[str] = None
) -> str:
  """The one line of `text` that starts with `prefix`.

  Args:
    text: a process's stdout or stderr.
    prefix: how the awaited line starts, such as "train_main: error:".
    context: what a failure shows of the process (default: `text`), such
      as its stdout and stderr together.

  Returns:
    That line, without its line break.

  Raises:
    AssertionError: no line, or more than one, starts with `prefix` (a test
      failure, showing the lines found and `context`).
  """
  lines = [line for line in text.splitlines() if line.startswith(prefix)]
  if len(lines) != 1:
    shown = text if context is None else context
    raise AssertionError(
        f"expected one line starting with {prefix!r}, found {len(lines)}: "
        f"{lines!r}\n{shown}"
    )
  return lines[0]
