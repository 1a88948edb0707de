"""Supervised fine-tuning (SFT) as a workload of the one training loop.

`workloads.run(config)` with `config.workload = "sft"` fine-tunes a model
(usually one imported from Hugging Face: `load_parameters_path`) on chat
examples under every guarantee of the loop (docs/sft.md). SFT is the
language-model workload on other data: its data set is `dataset_type="chat"`
(`maxtext/data/chat_dataset.py`: each example rendered with the model's chat
template, one padded row, weights 1 on the assistant's tokens and 0
elsewhere), its loss `transformer.loss_fn`, which averages over the weighted
tokens, so the prompt's tokens carry no gradient, and its eval the mean loss
over the held-out examples' assistant tokens. What it adds to `Workload` is
its settings (`SftConfig`), which the caller builds from the run's config and
which hold its check: the config names a chat data set.
"""

import dataclasses

from maxtext.core import component_config
from maxtext.run import workload


@dataclasses.dataclass(frozen=True)
class SftConfig(component_config.ComponentConfig):
  """What SFT requires of a run's config (`maxtext/configs/base.py`
  documents each field).

  Attributes:
    dataset_type: the data set's kind; SFT trains on chat examples (their
      files and tokenizer are the pre-flight's to check).
  """

  dataset_type: str = "synthetic"

  def validate(self) -> None:
    """Raises ValueError on a data set other than chat, one line naming it."""
    if self.dataset_type != "chat":
      raise component_config.fail(
          "dataset_type",
          self.dataset_type,
          "workload='sft' trains on chat examples; set dataset_type='chat' "
          "(docs/sft.md)",
      )


class SftWorkload(workload.Workload):
  """Fine-tuning on chat examples, the loss on the assistant's tokens.

  Args:
    settings: SFT's settings, checked (`SftConfig.from_config` of the run's
      config).
    build_engine: the language model's engine builder, as pretraining's.
  """

  name = "sft"

  def __init__(self, settings: SftConfig, build_engine: workload.EngineBuilder):
    super().__init__(build_engine)
    self.settings = settings
