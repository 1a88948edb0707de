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
its check: the config names a chat data set.
"""

from maxtext.run import workload


class SftWorkload(workload.Workload):
  """Fine-tuning on chat examples, the loss on the assistant's tokens."""

  name = "sft"

  def check(self, config) -> None:
    """A chat data set (its files and tokenizer: the pre-flight's).

    Raises:
      ValueError: another dataset_type, one line naming it.
    """
    if config.dataset_type != "chat":
      raise ValueError(
          f"config.dataset_type={config.dataset_type!r}: workload='sft' "
          "trains on chat examples; set dataset_type='chat' (docs/sft.md)"
      )
