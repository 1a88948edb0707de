"""Tests of resolving the user's paths against the caller's directory."""

import os

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.core import caller_paths


class ResolveLocalPathTest(absltest.TestCase):

  def test_relative_path_resolves_against_the_bazel_run_caller(self):
    env = {"BUILD_WORKING_DIRECTORY": "/home/user/project"}
    self.assertEqual(
        caller_paths.resolve_local_path("out/runs", env),
        "/home/user/project/out/runs",
    )

  def test_relative_path_without_bazel_uses_cwd(self):
    self.assertEqual(
        caller_paths.resolve_local_path("x", {}),
        os.path.join(os.getcwd(), "x"),
    )

  def test_absolute_and_home_paths(self):
    env = {"BUILD_WORKING_DIRECTORY": "/elsewhere"}
    self.assertEqual(caller_paths.resolve_local_path("/abs/p", env), "/abs/p")
    self.assertEqual(
        caller_paths.resolve_local_path("~/p", env),
        os.path.join(os.path.expanduser("~"), "p"),
    )


class ResolveConfigArgsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.caller = self.create_tempdir().full_path
    os.makedirs(os.path.join(self.caller, "cfg"))
    with open(
        os.path.join(self.caller, "cfg", "mine.py"), "w", encoding="utf-8"
    ) as f:
      f.write("def get_config(): ...\n")
    self.environ = {"BUILD_WORKING_DIRECTORY": self.caller}

  def resolve(self, args, environ=None):
    return caller_paths.resolve_config_args(
        ["train_main"] + args,
        self.environ if environ is None else environ,
        default_config="/defaults/default.py",
    )

  def test_default_config_named_first_when_none_given(self):
    self.assertEqual(
        self.resolve(["--config.steps=3", "--alsologtostderr"]),
        [
            "train_main",
            "--config=/defaults/default.py",
            "--config.steps=3",
            "--alsologtostderr",
        ],
    )

  def test_no_default_added_without_one(self):
    self.assertEqual(
        caller_paths.resolve_config_args(
            ["package", "--output_dir=x"], self.environ
        ),
        ["package", "--output_dir=x"],
    )

  @parameterized.named_parameters(
      ("double_dash", "--config="), ("single_dash", "-config=")
  )
  def test_relative_path_resolves_against_caller(self, prefix):
    self.assertEqual(
        self.resolve([prefix + "cfg/mine.py", "--config.steps=3"]),
        [
            "train_main",
            prefix + os.path.join(self.caller, "cfg/mine.py"),
            "--config.steps=3",
        ],
    )

  def test_config_argument_suffix_is_kept(self):
    self.assertEqual(
        self.resolve(["--config=cfg/mine.py:small"]),
        [
            "train_main",
            "--config=" + os.path.join(self.caller, "cfg/mine.py:small"),
        ],
    )

  def test_path_as_separate_argument(self):
    self.assertEqual(
        self.resolve(["--config", "cfg/mine.py", "--config.steps=3"]),
        [
            "train_main",
            "--config",
            os.path.join(self.caller, "cfg/mine.py"),
            "--config.steps=3",
        ],
    )

  @parameterized.named_parameters(
      # Not the caller's file: left for the binary's working directory.
      ("missing_in_caller_dir", ["--config=maxtext/configs/default.py"]),
      ("absolute", ["--config=/elsewhere/c.py"]),
      ("trailing_flag_without_value", ["--config"]),
  )
  def test_left_alone(self, args):
    self.assertEqual(self.resolve(args), ["train_main"] + args)

  def test_without_bazel_run_paths_are_left_alone(self):
    self.assertEqual(
        self.resolve(["--config=cfg/mine.py"], environ={}),
        ["train_main", "--config=cfg/mine.py"],
    )

  def test_config_after_double_dash_is_positional(self):
    self.assertEqual(
        self.resolve(["--", "--config=cfg/mine.py"]),
        [
            "train_main",
            "--config=/defaults/default.py",
            "--",
            "--config=cfg/mine.py",
        ],
    )

  def test_override_flags_are_not_config_files(self):
    # --config.x and --configs are other flags; the default is still added.
    self.assertEqual(
        self.resolve(["--config.run_name=cfg/mine.py", "--configs=x"]),
        [
            "train_main",
            "--config=/defaults/default.py",
            "--config.run_name=cfg/mine.py",
            "--configs=x",
        ],
    )

  def test_input_list_is_not_changed(self):
    argv = ["train_main", "--config=cfg/mine.py"]
    caller_paths.resolve_config_args(argv, self.environ)
    self.assertEqual(argv, ["train_main", "--config=cfg/mine.py"])

  def test_empty_argv(self):
    with self.assertRaisesRegex(ValueError, "program name"):
      caller_paths.resolve_config_args([], {})


if __name__ == "__main__":
  absltest.main()
