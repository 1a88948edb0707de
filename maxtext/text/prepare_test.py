"""Tests for maxtext.text.prepare on the standard library's sources."""

import json
import os

from absl.testing import absltest
from array_record.python import array_record_data_source
import numpy as np
import tokenizers

from maxtext.core import progress as progress_lib
from maxtext.text import metadata as metadata_lib
from maxtext.text import prepare
from maxtext.text import tokenizer as tokenizer_lib
from testing import stdlib_corpus

_VOCAB = 512


def _stream(data_dir, meta, split):
  """A split's ids, read back from its shards."""
  paths = [os.path.join(data_dir, s) for s in meta["splits"][split]["shards"]]
  source = array_record_data_source.ArrayRecordDataSource(paths)
  return np.concatenate(
      [
          np.frombuffer(source[i], meta["token_dtype"])
          for i in range(len(source))
      ]
  )


def _hf_tokenizer(path, vocab_size=None):
  """A Hugging Face tokenizer.json: a trained byte-level BPE, or (with
  vocab_size) a word-level vocabulary of that many ids."""
  if vocab_size:
    vocab = {f"w{i}": i for i in range(vocab_size - 1)}
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab, unk_token="w0")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  else:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
        add_prefix_space=False
    )
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(stdlib_corpus.files(3), trainer)
  tok.add_special_tokens(["<|endoftext|>"])
  tok.save(path)
  return path


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


class PrepareTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.lines = []

  def _prepare(self, inputs, name="out", **kwargs):
    kwargs.setdefault(
        "train_vocab_size", 0 if "tokenizer_path" in kwargs else _VOCAB
    )
    kwargs.setdefault("eval_every", 2)
    kwargs.setdefault("record_tokens", 100)
    out = os.path.join(self.root, name)
    return out, prepare.prepare(inputs, out, report=self.lines.append, **kwargs)

  def test_trained_tokenizer_shards_decode_to_the_documents(self):
    files = stdlib_corpus.files(5)
    out, meta = self._prepare(files, shard_tokens=2000)
    with open(
        os.path.join(out, metadata_lib.METADATA_FILE), encoding="utf-8"
    ) as f:
      self.assertEqual(json.load(f), meta)
    self.assertEqual(meta["vocab_size"], _VOCAB)
    self.assertEqual(meta["token_dtype"], "uint16")
    self.assertEqual(meta["input"]["documents"], 5)
    self.assertEqual(
        meta["tokenizer"]["sha256"],
        tokenizer_lib.file_sha256(os.path.join(out, "tokenizer.model")),
    )
    self.assertGreater(len(meta["splits"]["train"]["shards"]), 1)
    tok = tokenizer_lib.load(os.path.join(out, "tokenizer.model"))
    texts = [_read(f) for f in files]
    for split, wanted in (("eval", texts[0::2]), ("train", texts[1::2])):
      stream = _stream(out, meta, split)
      self.assertLen(stream, meta["splits"][split]["tokens"])
      self.assertEqual(meta["splits"][split]["documents"], len(wanted))
      ends = np.flatnonzero(stream == meta["eod_id"])
      self.assertLen(ends, len(wanted))
      docs = np.split(stream, ends + 1)[:-1]
      self.assertEqual([tok.decode(d[:-1]) for d in docs], wanted)

  def test_hugging_face_tokenizer_and_jsonl(self):
    hf = _hf_tokenizer(os.path.join(self.root, "tokenizer.json"))
    jsonl = os.path.join(self.root, "docs.jsonl")
    texts = [_read(f) for f in stdlib_corpus.files(4)]
    with open(jsonl, "w", encoding="utf-8") as f:
      for text in texts:
        f.write(json.dumps({"body": text}) + "\n")
    out, meta = self._prepare([jsonl], tokenizer_path=hf, text_field="body")
    self.assertEqual(meta["tokenizer"]["kind"], "huggingface")
    self.assertTrue(os.path.exists(os.path.join(out, "tokenizer.json")))
    tok = tokenizer_lib.load(os.path.join(out, "tokenizer.json"))
    stream = _stream(out, meta, "train")
    first = stream[: np.flatnonzero(stream == meta["eod_id"])[0]]
    self.assertEqual(tok.decode(first), texts[1])

  def test_invalid_utf8_is_counted_and_reported(self):
    bad = os.path.join(self.root, "bad.txt")
    with open(bad, "wb") as f:
      f.write(b"caf\xe9 au lait\n" * 50 + b"\xff\xfe end\n")
    _, meta = self._prepare([bad] + stdlib_corpus.files(2))
    self.assertEqual(meta["input"]["invalid_utf8_bytes"], 52)
    self.assertTrue(
        any(
            "52 byte(s) of invalid UTF-8 in 1 file(s)" in line
            for line in self.lines
        ),
        self.lines,
    )

  def test_progress_reports_bytes_files_documents_tokens_and_the_end(self):
    files = stdlib_corpus.files(3)
    ticks = iter(range(0, 1000, 5))  # Each reading of the clock 5 s later.
    shown = []
    reporter = progress_lib.Reporter(
        progress_lib.Lines(shown.append),
        interval_s=10.0,
        clock=lambda: float(next(ticks)),
    )
    _, meta = self._prepare(files, progress=reporter)
    size = progress_lib.format_bytes(sum(os.path.getsize(f) for f in files))
    tokens = sum(meta["splits"][s]["tokens"] for s in ("train", "eval"))
    # The three documents are encoded in one batch: one line when it is
    # done (10 s after the start), then the last line.
    self.assertLen(shown, 2)
    self.assertRegex(
        shown[0],
        rf"^prepare_data: {size} of {size} \(100%\), [\d.]+ [kM]?B/s, 10 s "
        rf"elapsed, ETA 0 s; files 3/3, documents 3, tokens {tokens:,} "
        r"\([\d,]+ tokens/s\)$",
    )
    self.assertRegex(
        shown[1],
        rf"^prepare_data: done, {size} in 20 s \([\d.]+ [kM]?B/s\); files "
        rf"3/3, documents 3, tokens {tokens:,} \([\d,]+ tokens/s\)$",
    )
    self.assertFalse([line for line in self.lines if "prepare_data" in line])

  def test_bad_inputs(self):
    missing = os.path.join(self.root, "missing.txt")
    empty = os.path.join(self.root, "empty.txt")
    with open(empty, "w", encoding="utf-8"):
      pass
    nofield = os.path.join(self.root, "nofield.jsonl")
    with open(nofield, "w", encoding="utf-8") as f:
      f.write('{"text": "a"}\n{"body": "b"}\n')
    big = _hf_tokenizer(os.path.join(self.root, "big.json"), vocab_size=70_000)
    corpus_files = stdlib_corpus.files(2)
    cases = [
        (dict(inputs=[missing]), r"^input='.*missing.txt': does not exist$"),
        (dict(inputs=[empty]), r"^input=.*: the corpus is empty"),
        (
            dict(inputs=[nofield], tokenizer_path=big),
            r"^.*nofield.jsonl:2: has no field 'text' \(set --text_field\)$",
        ),
        (
            dict(inputs=corpus_files, tokenizer_path=big, token_dtype="uint16"),
            r"^token_dtype='uint16': the tokenizer's vocabulary of 70000 ids "
            r"does not fit uint16; use uint32$",
        ),
        (
            dict(inputs=corpus_files, tokenizer_path=big, train_vocab_size=300),
            r"^give exactly one of --tokenizer and "
            r"--train_tokenizer_vocab_size",
        ),
        (
            dict(inputs=corpus_files, tokenizer_path=missing + ".model"),
            r"^tokenizer=.*: does not exist$",
        ),
    ]
    for i, (kwargs, message) in enumerate(cases):
      with self.subTest(message):
        with self.assertRaisesRegex(ValueError, message):
          self._prepare(name=f"bad{i}", **kwargs)
    # A big vocabulary is fine in uint32; a prepared directory is not
    # overwritten.
    _, meta = self._prepare(corpus_files, name="big", tokenizer_path=big)
    self.assertEqual(meta["token_dtype"], "uint32")
    with self.assertRaisesRegex(ValueError, r"already holds a prepared"):
      self._prepare(corpus_files, name="big", tokenizer_path=big)


if __name__ == "__main__":
  absltest.main()
