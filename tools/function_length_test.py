"""Tests for tools/function_length.py on synthetic sources and a real tree."""

import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

from tools import function_length


def _function(name: str, lines: int, indent: str = "") -> str:
  """A function `name` of exactly `lines` lines, def line included."""
  body = [f"{indent}  x = {i}" for i in range(lines - 2)]
  return (
      "\n".join([f"{indent}def {name}():"] + body + [f"{indent}  return x"])
      + "\n"
  )


class FunctionsInTest(absltest.TestCase):

  def test_counts_def_to_end_with_docstring_and_nested_functions(self):
    source = textwrap.dedent('''\
        @decorator
        def outer():
          """Doc.

          More.
          """
          def inner():
            return 1

          return inner


        class Outer:

          def method(self):
            return 2
        ''')
    found = function_length.functions_in("a.py", source)
    self.assertEqual(
        [(f.qualname, f.line, f.lines) for f in found],
        [("outer", 2, 9), ("outer.inner", 7, 2), ("Outer.method", 15, 2)],
    )


class FindingsTest(absltest.TestCase):

  def _findings(self, source: str, allowances: str = "") -> list[str]:
    functions = function_length.functions_in("m.py", source)
    return function_length.findings(
        functions, function_length.parse_allowances(allowances, "list")
    )

  def _only(self, problems: list[str]) -> str:
    self.assertLen(problems, 1)
    return problems[0]

  def test_a_function_of_80_lines_passes_and_one_of_81_fails(self):
    self.assertEqual(self._findings(_function("f", 80)), [])
    problem = self._only(self._findings(_function("f", 81)))
    self.assertEqual(
        problem, "m.py:1: f is 81 lines (at most 80); split it into named steps"
    )

  def test_a_long_nested_function_fails_on_its_own(self):
    source = "class C:\n\n  def m(self):\n" + _function("g", 90, "    ")
    problems = self._findings(source, "m.py C.m >80\n")
    self.assertEqual(
        problems,
        ["m.py:4: C.m.g is 90 lines (at most 80); split it into named steps"],
    )

  def test_a_listed_long_function_passes(self):
    self.assertEqual(self._findings(_function("f", 120), "m.py f >80\n"), [])

  def test_a_function_listed_over_60_may_not_grow_over_80(self):
    problem = self._only(self._findings(_function("f", 81), "m.py f >60\n"))
    self.assertIn("f is 81 lines (at most 80)", problem)

  def test_a_listed_function_now_short_or_gone_fails(self):
    self.assertEqual(
        self._findings(_function("f", 70), "m.py f >80\n"),
        [
            "m.py:1: f is now 70 lines, within its allowance >80; "
            "list it as >60"
        ],
    )
    self.assertEqual(
        self._findings(_function("f", 60), "m.py f >60\n"),
        [
            "m.py:1: f is now 60 lines, within its allowance >60; "
            "remove it from the list"
        ],
    )
    self.assertEqual(
        self._findings(_function("f", 60), "m.py g >60\n"),
        [
            f"{function_length.ALLOWANCES}: m.py g is gone; remove it from "
            "the list"
        ],
    )

  def test_at_most_30_functions_over_60_lines(self):
    thirty = "".join(_function(f"f{i}", 61) for i in range(30))
    self.assertEqual(self._findings(thirty), [])
    problem = self._only(self._findings(thirty + _function("late", 61)))
    self.assertStartsWith(
        problem, "31 functions are over 60 lines, at most 30 allowed"
    )
    self.assertIn("m.py:1831: late (61)", problem)

  def test_while_the_list_is_long_a_new_function_over_60_fails(self):
    listed = "".join(_function(f"f{i}", 61) for i in range(40))
    allowances = "".join(f"m.py f{i} >60\n" for i in range(40))
    self.assertEqual(self._findings(listed, allowances), [])
    problem = self._only(
        self._findings(listed + _function("new", 61), allowances)
    )
    self.assertStartsWith(
        problem, "41 functions are over 60 lines, at most 40 allowed"
    )
    self.assertIn("not listed: m.py:2441: new (61)", problem)

  def test_a_malformed_list_line_is_named(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^list:2: expected 'PATH QUALNAME >80\|>60', got 'm.py f 80'$",
    ):
      function_length.parse_allowances("# comment\nm.py f 80\n", "list")
    with self.assertRaisesRegex(ValueError, "list:2: m.py f is listed twice"):
      function_length.parse_allowances("m.py f >60\nm.py f >80\n", "list")


class CommandTest(absltest.TestCase):

  def _tree(self, files: dict[str, str]) -> str:
    root = self.create_tempdir().full_path
    for path, text in files.items():
      os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
      with open(os.path.join(root, path), "w", encoding="utf-8") as f:
        f.write(text)
    return root

  def _run(self, root: str) -> subprocess.CompletedProcess:
    script = os.path.join(os.path.dirname(__file__), "function_length.py")
    return subprocess.run(
        [sys.executable, script],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )

  def test_fails_on_a_long_function_and_skips_configs_and_tests(self):
    long = _function("long", 81)
    root = self._tree(
        {
            "maxtext/configs/base.py": long,
            "maxtext/a_test.py": long,
            "tools/long_functions.txt": "",
        }
    )
    result = self._run(root)
    self.assertEqual((result.returncode, result.stdout), (0, ""))
    with open(os.path.join(root, "tools/tool.py"), "w", encoding="utf-8") as f:
      f.write(long)
    result = self._run(root)
    self.assertEqual(result.returncode, 1)
    self.assertEqual(
        result.stdout,
        "tools/tool.py:1: long is 81 lines (at most 80); split it into "
        "named steps\n",
    )

  def test_a_bad_list_is_one_line_with_status_2(self):
    root = self._tree({"tools/long_functions.txt": "tools/x.py f\n"})
    result = self._run(root)
    self.assertEqual(result.returncode, 2)
    self.assertEqual(
        result.stderr,
        "function_length: error: tools/long_functions.txt:1: expected "
        "'PATH QUALNAME >80|>60', got 'tools/x.py f'\n",
    )


if __name__ == "__main__":
  absltest.main()
