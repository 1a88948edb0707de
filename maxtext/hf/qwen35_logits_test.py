"""Qwen3.5-MoE checkpoints through transformers and back.

Tiny random `Qwen3_5MoeForCausalLM` models (transformers 5.24, CPU torch:
8 layers, full attention every 4th, the rest Gated DeltaNet; every layer
MoE, top-2 of 4 experts with a gated shared expert; zero-centred norms,
gated attention, rotary on a quarter of each head) are saved, imported,
restored and run in float32. Every layer, fed transformers' input to that
layer, must give transformers' output to 1e-5 of its largest magnitude
(`test_every_layer_matches_transformers`). The whole model's logits must
match to `_MODEL_RELATIVE` (1e-4) of theirs: the float32 delta rule's
rounding grows through 8 random layers. The decays are drawn as a trained
model's long memories are (A in [0.02, 0.5], small `in_proj_a` weights):
with A up to 8 and large `in_proj_a` weights (the first version of this
test) a token's log decay reached -30 and the chunk's cumulative sums
-1,000, where float32 keeps only 6e-5 of absolute precision, and ours and
transformers' logits were 1.9e-4 of the scale apart (transformers' own
chunked and token-by-token rules 1.7e-4). Measured on this model (seed 3,
ids seed 0, 40 tokens): 2.6e-5 apart; 1e-5 held for some seeds and depths
and not for others (5e-6 to 4e-5 over 4- and 8-layer models), so it is not
the bound. Greedy ids equal transformers' `generate` through both
decoders. The parameters are
then exported, loaded back with `AutoModelForCausalLM.from_pretrained`,
whose logits must equal the original model's exactly, and every tensor
must equal the original's bit for bit. The published layout
(`Qwen3_5MoeForConditionalGeneration`, a vision tower and
multi-token-prediction weights beside the text model) imports to the
logits of that model's text path.

One test per trap, each showing the logits comparison would catch it: the
DeltaNet output norm scales by w where every other norm scales by 1 + w;
q_proj interleaves each head's query and gate rows; the router renormalises
its top-k softmax probabilities. And the rotary embedding with the vision
model's 3-D (mrope) positions equals the 1-D partial rotary when the three
position rows are equal, as they are for text.
"""

from testing import run_compile_level

# The model's logits are held to 1e-4 of transformers' scale: a margin
# measured with XLA's CPU programs compiled as a run's (the router trap's
# model reaches 0.97 of it there, 1.5 with the suite's cheap compiles), so
# this test compiles as runs do.
run_compile_level.request()

# XLA reads the flags when JAX starts, so the imports follow.
# pylint: disable=wrong-import-position,wrong-import-order
import dataclasses
import json
import os

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import safetensors.torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import torch

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
import transformers

# pylint: disable-next=import-error  # In the @pypi_torch lock, not lint's.
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

from maxtext.generation import decoder
from maxtext.generation import paged_decoder
from maxtext.generation import sampling
from maxtext.hf import exporter
from maxtext.hf import importer
from maxtext.hf import logits_check
from maxtext.hf import qwen35
from maxtext.model import gated_deltanet
from maxtext.model import moe
from maxtext.model import transformer

_VOCAB = 96
# The whole model's logits tolerance (module docstring); each layer's is
# logits_check.RELATIVE.
_MODEL_RELATIVE = 1e-4
_HEADS, _HEAD_DIM, _EMB = 4, 32, 48
_TEXT = dict(
    vocab_size=_VOCAB,
    hidden_size=_EMB,
    num_hidden_layers=8,
    num_attention_heads=_HEADS,
    num_key_value_heads=2,
    head_dim=_HEAD_DIM,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=4,
    moe_intermediate_size=12,
    shared_expert_intermediate_size=20,
    num_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    tie_word_embeddings=False,
)


def _randomise(model):
  """Every parameter random: zero-centred norm weights around 0 (scale
  1 + w), the DeltaNet output norm's around 1 (scale w), decay rates
  A in [0.02, 0.5] and small decay projections (module docstring)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn_like(p)
      if name.endswith("linear_attn.norm.weight"):
        p.copy_(1.0 + 0.3 * noise)
      elif name.endswith("norm.weight"):
        p.copy_(0.3 * noise)
      elif name.endswith("A_log"):
        p.copy_(torch.empty_like(p).uniform_(0.02, 0.5).log())
      elif name.endswith("in_proj_a.weight"):
        p.copy_(0.05 * noise)
      else:
        p.copy_(0.25 * noise)
  return model


def _causal_lm(seed: int):
  torch.manual_seed(seed)
  config = transformers.Qwen3_5MoeTextConfig(
      attn_implementation="eager", **_TEXT
  )
  assert config.layer_types[3] == "full_attention", config.layer_types
  return _randomise(transformers.Qwen3_5MoeForCausalLM(config).float().eval())


def _conditional_generation(seed: int):
  """A tiny random Qwen3_5MoeForConditionalGeneration (a one-block vision
  tower beside the text model of _TEXT)."""
  torch.manual_seed(seed)
  config = transformers.Qwen3_5MoeConfig(
      text_config=_TEXT,
      vision_config=dict(
          depth=1,
          hidden_size=16,
          intermediate_size=32,
          num_heads=2,
          out_hidden_size=_EMB,
          patch_size=4,
          num_position_embeddings=16,
      ),
      attn_implementation="eager",
  )
  model = transformers.Qwen3_5MoeForConditionalGeneration(config)
  return _randomise(model.float().eval())


def _ids(seed: int) -> np.ndarray:
  """[2, 40] token ids."""
  return np.random.default_rng(seed).integers(0, _VOCAB, (2, 40))


def _hf_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids)).logits.float().numpy()


def _logits(params, config, ids) -> np.ndarray:
  return np.asarray(transformer.apply(params, ids, config))


def _config_json(directory: str) -> dict:
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    return json.load(f)


def _imported(test, model):
  """(hf_dir, config, params, printed) of `model` saved and imported."""
  tmp = test.create_tempdir().full_path
  hf_dir = os.path.join(tmp, "hf")
  model.save_pretrained(hf_dir)
  printed = []
  out = os.path.join(tmp, "imported")
  config = importer.import_checkpoint(hf_dir, out, log=printed.append)
  params = logits_check.restore_on_one_device(out, config)
  return hf_dir, config, params, printed


def _assert_differs(test, actual, expected):
  """The logits differ far beyond the model comparison's tolerance."""
  diff = np.abs(actual - expected).max()
  test.assertGreater(diff, 10 * _MODEL_RELATIVE * np.abs(expected).max())


def _close(test, actual, expected):
  logits_check.assert_close_to_scale(test, actual, expected, _MODEL_RELATIVE)


class Qwen35LogitsTest(parameterized.TestCase):

  def test_causal_lm_import_export_matches_transformers(self):
    model = _causal_lm(3)
    ids = _ids(0)
    expected = _hf_logits(model, ids)
    hf_dir, config, params, printed = _imported(self, model)
    for line in (
        "config.full_attention_interval = 4",
        "config.norm_zero_centered = True",
        "config.attention_output_gate = True",
        "config.partial_rotary_factor = 0.25",
        "config.shared_expert_mlp_dim = 20",
        "config.linear_num_value_heads = 4",
    ):
      self.assertIn(line, printed)
    self.assertEqual(params["linear_layers"]["wq"].shape, (6, _EMB, 2, 8))
    self.assertEqual(
        params["moe_layers"]["wq_gate"].shape, (2, _EMB, _HEADS, _HEAD_DIM)
    )
    _close(self, _logits(params, config, ids), expected)

    tmp = self.create_tempdir().full_path
    exported = os.path.join(tmp, "exported")
    exporter.export_checkpoint(config, params, exported, "float32")
    self.assertEqual(
        qwen35.config_fields(_config_json(exported), "exported"),
        qwen35.config_fields(_config_json(hf_dir), "original"),
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        exported, attn_implementation="eager"
    ).eval()
    self.assertEqual(type(reloaded).__name__, qwen35.ARCHITECTURE)
    np.testing.assert_array_equal(_hf_logits(reloaded, ids), expected)
    logits_check.assert_same_tensors(self, hf_dir, exported)

  def test_every_layer_matches_transformers(self):
    model = _causal_lm(3)
    ids = _ids(0)
    _, config, params, _ = _imported(self, model)
    with torch.no_grad():
      hidden = model(
          input_ids=torch.tensor(ids), output_hidden_states=True
      ).hidden_states
    stacks = {"linear_attention": [], "full_attention": []}
    for i, kind in enumerate(model.config.layer_types):
      stacks[kind].append(i)
    for i, kind in enumerate(model.config.layer_types):
      stack = "linear_layers" if kind == "linear_attention" else "moe_layers"
      index = stacks[kind].index(i)
      layer = {name: a[index] for name, a in params[stack].items()}
      x = jnp.asarray(hidden[i].numpy())
      normed = transformer.norm(x, layer["attn_norm"], config)
      if kind == "linear_attention":
        mixed, _ = gated_deltanet.apply(normed, layer, config)
      else:
        # pylint: disable-next=protected-access  # One layer alone.
        mixed = transformer._attention(
            normed, layer, config, None, transformer.Rows()
        )
      x = x + mixed
      out, _ = moe.moe_mlp(
          transformer.norm(x, layer["mlp_norm"], config), layer, config
      )
      x = x + out
      if i == len(hidden) - 2:  # transformers' last hidden state is normed.
        x = transformer.norm(x, params["final_norm"], config)
      expected = hidden[i + 1].numpy()
      diff = float(np.abs(np.asarray(x) - expected).max())
      self.assertLessEqual(
          diff,
          logits_check.RELATIVE * float(np.abs(expected).max()),
          f"layer {i} ({kind})",
      )

  def test_conditional_generation_layout_imports_the_text_model(self):
    model = _conditional_generation(4)
    tmp = self.create_tempdir().full_path
    hf_dir = os.path.join(tmp, "hf")
    model.save_pretrained(hf_dir)
    # The published checkpoints hold multi-token-prediction weights too.
    path = os.path.join(hf_dir, "model.safetensors")
    tensors = safetensors.torch.load_file(path)
    tensors["mtp.fc.weight"] = torch.zeros(_EMB, 2 * _EMB)
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    printed = []
    out = os.path.join(tmp, "imported")
    config = importer.import_checkpoint(hf_dir, out, log=printed.append)
    skipped = [line for line in printed if "is not imported" in line]
    self.assertLen(skipped, 2)
    self.assertIn("vision tower", skipped[0])
    self.assertIn("mtp.", skipped[1])
    params = logits_check.restore_on_one_device(out, config)
    ids = _ids(1)
    _close(self, _logits(params, config, ids), _hf_logits(model, ids))

  def test_greedy_ids_equal_transformers_generate(self):
    # Prompts of 7 and 19 tokens continued 16 tokens greedily: by
    # transformers' `generate` (its cache: chunked prefill, then the
    # token-by-token delta rule on carried states), by the static cached
    # decoder and by the paged engine (one slot, the default pages of 16:
    # prompts and the DeltaNet states moved between programs; the longer
    # sequence spans 3 pages). Pages of 4 made tables of up to 16 pages,
    # 5 decode programs compiled at XLA's default level (1 to 16 pages);
    # pages of 16 make 3.
    model = _causal_lm(3)
    _, config, params, _ = _imported(self, model)
    ids = _ids(5)
    prompts = [[int(i) for i in ids[0, :7]], [int(i) for i in ids[1, :19]]]
    new = 16
    options = sampling.SamplingOptions(max_new_tokens=new)
    ours = {
        "static": decoder.generate(params, config, prompts, options).ids,
        "paged": paged_decoder.generate(
            params,
            config,
            prompts,
            options,
            engine=paged_decoder.EngineOptions(num_slots=1),
        ).ids,
    }
    for row, prompt in enumerate(prompts):
      with torch.no_grad():
        theirs = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].numpy()
      self.assertLen(theirs, new)
      for name, got in ours.items():
        if np.array_equal(got[row], theirs):
          continue
        # Only a near-tie may part them: say where and how near.
        first = int(np.argmax(got[row] != theirs))
        logits = _hf_logits(model, np.asarray([prompt + list(theirs[:first])]))
        top2 = np.sort(logits[0, -1])[-2:]
        self.fail(
            f"{name} row {row}: ids differ at step {first}; transformers' "
            f"top-2 logit gap there is {top2[1] - top2[0]:.3g}"
        )

  def test_trap_deltanet_output_norm_is_not_zero_centred(self):
    model = _causal_lm(5)
    ids = _ids(2)
    expected = _hf_logits(model, ids)
    _, config, params, _ = _imported(self, model)
    _close(self, _logits(params, config, ids), expected)
    # Scaling the output norm by 1 + w, as the other norms are, is wrong.
    linear = dict(params["linear_layers"])
    linear["out_norm"] = linear["out_norm"] + 1.0
    _assert_differs(
        self,
        _logits({**params, "linear_layers": linear}, config, ids),
        expected,
    )
    # And the other norms scaled by w are wrong too.
    plain = dataclasses.replace(config, norm_zero_centered=False)
    _assert_differs(self, _logits(params, plain, ids), expected)

  def test_trap_query_and_gate_rows_interleave_per_head(self):
    model = _causal_lm(6)
    ids = _ids(3)
    expected = _hf_logits(model, ids)
    _, config, params, _ = _imported(self, model)
    q_proj = (
        model.model.layers[3].self_attn.q_proj.weight.detach().numpy()
    )  # [H * 2D, E]
    d = _HEAD_DIM
    for h in range(_HEADS):
      np.testing.assert_array_equal(
          np.asarray(params["moe_layers"]["wq"][0][:, h]),
          q_proj[2 * h * d : (2 * h + 1) * d].T,
      )
      np.testing.assert_array_equal(
          np.asarray(params["moe_layers"]["wq_gate"][0][:, h]),
          q_proj[(2 * h + 1) * d : (2 * h + 2) * d].T,
      )
    # Read as all queries then all gates, the rows give other logits.
    attention = dict(params["moe_layers"])
    both = jnp.concatenate([attention["wq"], attention["wq_gate"]], axis=-1)
    flat = both.reshape(both.shape[:2] + (2 * _HEADS, d))
    attention["wq"], attention["wq_gate"] = (
        flat[:, :, :_HEADS],
        flat[:, :, _HEADS:],
    )
    _assert_differs(
        self,
        _logits({**params, "moe_layers": attention}, config, ids),
        expected,
    )

  def test_trap_router_renormalises_its_top_k(self):
    model = _causal_lm(7)
    ids = _ids(4)
    expected = _hf_logits(model, ids)
    _, config, params, _ = _imported(self, model)
    _close(self, _logits(params, config, ids), expected)
    plain = dataclasses.replace(config, router_norm_topk=False)
    _assert_differs(self, _logits(params, plain, ids), expected)

  def test_text_positions_give_the_one_dimensional_partial_rotary(self):
    hf_config = transformers.Qwen3_5MoeTextConfig(**_TEXT)
    rotary = modeling_qwen3_5_moe.Qwen3_5MoeTextRotaryEmbedding(hf_config)
    rng = np.random.default_rng(5)
    q = rng.normal(size=(2, 40, _HEADS, _HEAD_DIM)).astype(np.float32)
    positions = np.stack([np.arange(40), np.arange(7, 47)])
    ours = np.asarray(
        transformer._rotary(  # pylint: disable=protected-access  # The rotary alone.
            jnp.asarray(q),
            jnp.asarray(positions),
            _RotaryConfig(),
        )
    )

    def theirs(position_ids):
      q_t = torch.tensor(q).transpose(1, 2)  # [B, H, S, D]
      cos, sin = rotary(q_t, position_ids)
      out, _ = modeling_qwen3_5_moe.apply_rotary_pos_emb(q_t, q_t, cos, sin)
      return out.transpose(1, 2).numpy()

    # Text: [B, S] positions, the same for the three mrope rows.
    text = theirs(torch.tensor(positions))
    np.testing.assert_allclose(ours, text, rtol=0, atol=1e-5)
    # Vision positions (rows differ) turn some pairs otherwise: the
    # comparison above would see a layout that mixed them up.
    grid = torch.tensor(np.stack([positions, positions * 2, positions * 3]))
    self.assertGreater(np.abs(theirs(grid) - text).max(), 1e-2)
    # The last three quarters of each head pass unturned.
    np.testing.assert_array_equal(ours[..., _HEAD_DIM // 4 :], q[..., 8:])

  @parameterized.named_parameters(
      (
          "layer_types",
          {
              "layer_types": ["linear_attention"] * 3
              + ["full_attention"]
              + ["linear_attention"] * 2
              + ["full_attention"] * 2
          },
          "layer_types=",
      ),
      (
          "rope",
          {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
          "rope_parameters.factor",
      ),
      ("bias", {"attention_bias": True}, "attention_bias=True"),
      ("act", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
  )
  def test_unsupported_fields_are_refused_in_one_line(self, change, message):
    hf_dir = os.path.join(self.create_tempdir().full_path, "hf")
    _causal_lm(8).save_pretrained(hf_dir)
    logits_check.assert_import_refuses(self, hf_dir, change, message)


class _RotaryConfig:
  """The fields `transformer._rotary` reads, as _TEXT sets them."""

  rope_theta = 1000.0
  partial_rotary_factor = 0.25
  rope_scaling = "none"


if __name__ == "__main__":
  absltest.main()
