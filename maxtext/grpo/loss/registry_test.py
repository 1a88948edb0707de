"""A registry holds one function per name of its table, and no other."""

from absl.testing import absltest

from maxtext.grpo.loss import registry


def _make():
  return registry.Registry("grpo_thing", ("a", "b"))


class RegistryTest(absltest.TestCase):

  def test_looks_up_registered_functions_by_name(self):
    things = _make()
    things.register("a")(lambda x: x + 1)
    things.register("b")(lambda x: x * 10)
    things.complete()
    self.assertEqual(things["a"](2), 3)
    self.assertEqual(things["b"](2), 20)
    self.assertEqual(things.names, ("a", "b"))

  def test_the_decorator_returns_the_function(self):
    things = _make()

    @things.register("a")
    def double(x):
      return 2 * x

    self.assertEqual(double(4), 8)
    self.assertIs(things["a"], double)

  def test_an_unknown_name_names_the_field_and_the_choices(self):
    things = _make()
    things.register("a")(abs)
    with self.assertRaisesRegex(
        ValueError, r"^grpo_thing='c': must be one of \['a', 'b'\]$"
    ):
      things["c"]  # pylint: disable=pointless-statement  # Raises.
    with self.assertRaisesRegex(ValueError, "grpo_thing='c'"):
      things.check("c")

  def test_a_name_outside_the_table_is_refused(self):
    with self.assertRaisesRegex(ValueError, "'c' is not one of the choices"):
      _make().register("c")

  def test_a_name_registered_twice_is_refused(self):
    things = _make()
    things.register("a")(abs)
    with self.assertRaisesRegex(ValueError, "registered twice"):
      things.register("a")

  def test_complete_names_a_choice_without_a_function(self):
    things = _make()
    things.register("a")(abs)
    with self.assertRaisesRegex(ValueError, r"no implementation of \['b'\]"):
      things.complete()


if __name__ == "__main__":
  absltest.main()
