"""A Llama 3 style tokenizer.json with an imported model, end to end.

Offline: a byte-level BPE tokenizer built like Llama 3's (its split regex,
then bytes mapped to printable characters; <|begin_of_text|> and
<|end_of_text|> as special tokens) is trained with the `tokenizers` library
on text the test writes, and saved beside a tiny random `LlamaForCausalLM`
from `transformers` whose vocabulary covers it. The real binaries then run
as a user would: `//tools:import_checkpoint` on that directory,
`//tools:prepare_data --tokenizer=<its tokenizer.json>`, `//maxtext:train_main`
from the import on the prepared text, and `//tools:generate --prompt=...`
from the trained run. The prompt must be encoded as transformers encodes it,
and the printed continuation must be the library's decoding of the ids the
run draws. Finally `//tools:export_checkpoint` writes the trained run with
the tokenizer files the import copied: transformers loads model and
tokenizer from that one directory, and the tokenizer encodes the prompt as
before.
"""

import json
import os

from absl.testing import absltest
import numpy as np
import tokenizers

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

from maxtext.generation import generate
from maxtext.text import metadata
from maxtext.generation import sampling
from maxtext.text import tokenizer as tokenizer_lib
from testing import runfiles
from testing import tiny_configs

# Llama 3's pre-tokenizer split: contractions, words with one leading
# non-letter, 1-3 digit groups, punctuation runs, newlines, spaces.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>")
_BPE_VOCAB = 320
# The model's rows: more than the tokenizer's ids, as published Llama 3
# checkpoints pad theirs.
_MODEL_VOCAB = 336
_PROMPT = "The river runs"

_WORDS = (
    "the river runs past the old mill and the miller counts 123 sacks of "
    "grain; it's late, the wheel turns — café naïve déjà vu.\n"
)


def _documents() -> list[str]:
  """Small prose documents with repeated words, digits and non-ASCII text."""
  return [
      f"Document {i}: " + _WORDS * (2 + i % 3) + f"Ending {i * 7}.\n"
      for i in range(60)
  ]


def _llama3_style_tokenizer(texts: list[str]) -> tokenizers.Tokenizer:
  """A byte-level BPE tokenizer set up as Llama 3's, trained on `texts`."""
  tokenizer = tokenizers.Tokenizer(
      tokenizers.models.BPE(ignore_merges=True, byte_fallback=False)
  )
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
      [
          tokenizers.pre_tokenizers.Split(
              tokenizers.Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False
          ),
          tokenizers.pre_tokenizers.ByteLevel(
              add_prefix_space=False, trim_offsets=True, use_regex=False
          ),
      ]
  )
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=_BPE_VOCAB,
      special_tokens=list(_SPECIALS),
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  tokenizer.train_from_iterator(texts, trainer=trainer)
  return tokenizer


def _run(binary, *args):
  return runfiles.run_binary(binary, list(args), timeout_s=600)


class Llama3TokenizerTest(absltest.TestCase):

  def test_prepare_train_and_generate_with_an_imported_model(self):
    root = tiny_configs.fresh_output_dir("llama3_tokenizer_test_")
    docs = _documents()
    hf_dir = os.path.join(root, "hf")
    os.makedirs(hf_dir)
    tok = _llama3_style_tokenizer(docs)
    self.assertEqual(tok.get_vocab_size(), _BPE_VOCAB)
    # Byte-level: text outside the training set still encodes and decodes.
    unseen = "zebra ✓ 東京 9876"
    self.assertEqual(tok.decode(tok.encode(unseen).ids), unseen)
    tokenizer_json = os.path.join(hf_dir, "tokenizer.json")
    tok.save(tokenizer_json)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=tokenizer_json,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
    )
    fast.save_pretrained(hf_dir)  # tokenizer_config.json, as published.

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=_MODEL_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=32,
            bos_token_id=tok.token_to_id("<|begin_of_text|>"),
            eos_token_id=tok.token_to_id("<|end_of_text|>"),
            tie_word_embeddings=False,
        )
    )
    model.save_pretrained(hf_dir)
    self.assertTrue(os.path.isfile(tokenizer_json))

    imported = os.path.join(root, "imported")
    done = _run(
        "tools/import_checkpoint",
        f"--input={hf_dir}",
        f"--output_dir={imported}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(f"config.vocab_size = {_MODEL_VOCAB}\n", done.stdout)

    text_dir = os.path.join(root, "text")
    os.makedirs(text_dir)
    for i, doc in enumerate(docs):
      with open(
          os.path.join(text_dir, f"{i:03d}.txt"), "w", encoding="utf-8"
      ) as f:
        f.write(doc)
    prepared = os.path.join(root, "prepared")
    done = _run(
        "tools/prepare_data",
        f"--input={text_dir}",
        f"--output_dir={prepared}",
        f"--tokenizer={os.path.join(hf_dir, 'tokenizer.json')}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    meta = metadata.load(prepared)
    self.assertEqual(meta["vocab_size"], _BPE_VOCAB)
    self.assertEqual(meta["eod_id"], tok.token_to_id("<|end_of_text|>"))
    self.assertEqual(meta["tokenizer"]["kind"], tokenizer_lib.HUGGINGFACE)
    self.assertEqual(
        meta["tokenizer"]["sha256"], tokenizer_lib.file_sha256(tokenizer_json)
    )

    runs = os.path.join(root, "runs")
    flags = tiny_configs.tiny_flags(
        runs,
        run_name="tuned",
        steps=2,
        extra={
            "num_layers": 2,
            "vocab_size": _MODEL_VOCAB,
            "max_sequence_length": 16,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "eval_interval": 2,
            "checkpoint_period": 2,
        },
    )
    proc = runfiles.run_binary(
        "maxtext/train_main",
        [
            f"--config={imported}/config.py",
            f"--config.load_parameters_path={imported}",
            "--config.dataset_type=grain",
            f"--config.train_data_path={prepared}",
        ]
        + flags,
        timeout_s=600,
        cache_compilations=True,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn("train_main: completed after step 2", proc.stdout)

    run_dir = os.path.join(runs, "tuned")
    run = generate.load_run(run_dir)
    self.assertEqual(run.step, 2)
    self.assertEqual(
        run.tokenizer.path, os.path.join(prepared, meta["tokenizer"]["file"])
    )
    # The prompt is encoded as transformers encodes it with the model's
    # tokenizer files (no special token added: prompts continue text).
    prompt_ids = fast(_PROMPT, add_special_tokens=False)["input_ids"]
    self.assertEqual(generate.encode_prompt(run, _PROMPT), prompt_ids)
    self.assertGreater(len(prompt_ids), 1)

    new_tokens = 8
    options = sampling.SamplingOptions(
        max_new_tokens=new_tokens, temperature=0.0
    )
    ids = generate.generate_ids(run, prompt_ids, options)[0]
    self.assertNotEmpty(ids)
    self.assertTrue(all(0 <= i < _BPE_VOCAB for i in ids), ids)
    done = _run(
        "tools/generate",
        f"--run_dir={run_dir}",
        f"--prompt={_PROMPT}",
        f"--max_new_tokens={new_tokens}",
        "--temperature=0",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    eod = tok.token_to_id("<|end_of_text|>")
    kept = ids[: ids.index(eod)] if eod in ids else ids
    continuation = fast.decode(kept, skip_special_tokens=True)
    expected = _PROMPT + continuation
    lines = done.stdout.split("=== sample 1/1 ===\n", 1)
    self.assertLen(lines, 2, done.stdout)
    self.assertEqual(lines[1], expected + "\n")
    # Greedy decoding of a random model drew real text, not an immediate
    # end of document.
    self.assertNotEmpty(kept)
    self.assertNotEmpty(continuation)
    # The trained parameters moved off the imported ones, but only a little.
    start = generate.load_run(imported)
    moved = np.abs(
        np.asarray(run.params["embedding"])
        - np.asarray(start.params["embedding"])
    ).max()
    self.assertGreater(moved, 0.0)
    self.assertLess(moved, 10 * 1e-3 * 2)
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
      self.assertIn(prepared, json.dumps(json.load(f)))

    # The import kept the tokenizer files; the export of the trained run
    # writes them back beside the weights.
    self.assertTrue(os.path.isfile(os.path.join(imported, "tokenizer.json")))
    exported = os.path.join(root, "exported")
    done = _run(
        "tools/export_checkpoint",
        f"--run_dir={run_dir}",
        f"--output_dir={exported}",
    )
    self.assertEqual(done.returncode, 0, done.stderr)
    self.assertIn(
        "export_checkpoint: copied tokenizer_config.json from "
        f"{os.path.join(imported, 'tokenizer_config.json')}\n",
        done.stdout,
    )
    self.assertIn("export_checkpoint: copied tokenizer.json from ", done.stdout)
    self.assertNotIn("warning", done.stdout)
    reloaded = transformers.AutoTokenizer.from_pretrained(exported)
    self.assertEqual(
        reloaded(_PROMPT, add_special_tokens=False)["input_ids"], prompt_ids
    )
    self.assertEqual(reloaded.eos_token, "<|end_of_text|>")
    model = transformers.AutoModelForCausalLM.from_pretrained(exported)
    np.testing.assert_array_equal(
        model.model.embed_tokens.weight.detach().numpy(),
        np.asarray(run.params["embedding"]),
    )


if __name__ == "__main__":
  absltest.main()
