#!/usr/bin/python3
"""Megatron-LM legacy (per-rank torch.save) checkpoints for the resharded-view tests.

Two independent halves:

* The GENERATOR builds a random full GPT/Llama-style model from a ModelConfig and writes it
  sharded for TP x PP the way Megatron-LM's `save_checkpoint` does (ckpt_format 'torch', no
  distributed optimizer): ROOT/iter_{:07d}/mp_rank_{tp:02d}[_{pp:03d}]/model_optim_rng.pt and
  ROOT/latest_checkpointed_iteration.txt. It knows the model: fused QKV is built from separate
  q, k, v per query group, SwiGLU's fc1 from separate gate and up halves.
* The REFERENCE (`reference_shard`) knows nothing of the generator: it reads the source rank files
  and applies the rules of docs/views.md literally (suffix rules, vocabulary padding, stage
  renumbering, tied head copy, optimizer resharding, primary source rank). It is what a view of
  the source must equal, bit for bit.

`reference_shard(root, T_s, P_s)` equal to the source files is the cross-check of the two.

CLI (run with /usr/bin/python3, which has torch):
  megatron_fixture.py generate ROOT --tp 4 --pp 2 [--era legacy] [--groups 4] [--swiglu] [--untie]
                      [--marks] [--mystery] [--cuda] ...    write a source checkpoint
  megatron_fixture.py reference ROOT OUT --tp 2 --pp 1      write the expected view as files
  megatron_fixture.py compare ROOT --tp 2 --pp 1 [--view D] compare ROOT/.views/tp2-pp1 (or D)

Facts taken from Megatron-LM's own code (NVIDIA/Megatron-LM; read, not copied):
  [CKPT]   megatron/training/checkpointing.py: get_checkpoint_name (paths), save_checkpoint (tracker
           holds str(iteration); 'num_floating_point_operations_so_far' added after
           generate_state_dict), generate_state_dict (keys and their order: args,
           checkpoint_version 3.0, iteration, model, optimizer, opt_param_scheduler, rng_state;
           no rerun_state_machine for ckpt_format 'torch'), get_rng_state (a one-element list of
           {random_rng_state, np_rng_state, torch_rng_state, cuda_rng_state, rng_tracker_states}
           without data_parallel_random_init), check_checkpoint_args (padded_vocab_size,
           tensor/pipeline_model_parallel_size are compared on load: the view must rewrite them).
  [RNG]    megatron/core/tensor_parallel/random.py: CudaRNGStatesTracker.get_states ({name: state}),
           model_parallel_cuda_manual_seed adds 'data-parallel-rng', 'model-parallel-rng',
           'expert-parallel-rng'.
  [MCORE]  megatron/core/models/gpt/gpt_model.py (embedding, decoder, output_layer; the output layer
           skips its weight when pre_process and tied, so PP=1 tied stores only
           output_layer._extra_state); transformer/attention.py (Attention.__init__ creates
           core_attention and linear_proj before SelfAttention creates linear_qkv: linear_proj comes
           first in the state dict; QKV rows are [groups, (heads/groups + 2) * head_dim]: each
           group's query heads, its key, its value); transformer/transformer_layer.py
           (input_layernorm, self_attention, pre_mlp_layernorm, mlp); transformer/mlp.py (SwiGLU:
           fc1 width doubled, each TP shard [gate_t; up_t], activation chunks it in two);
           tensor_parallel/layers.py (Column/RowParallelLinear.get_extra_state returns None, so
           every linear writes `<name>._extra_state: None`; VocabParallelEmbedding has none).
  [LEGACY] megatron/legacy/model/{gpt_model,language_model,transformer,module}.py as of the commit
           before 39ec5ebeb4 (which removed them): nested dicts language_model.{embedding.
           {word_embeddings,position_embeddings}, encoder (flat 'layers.N...' keys, final_norm),
           output_layer (untied only)}, word_embeddings_for_head only when post_process and not
           pre_process and tied; layer order input_norm, self_attention.query_key_value,
           self_attention.dense, post_attention_norm, mlp.dense_h_to_4h, mlp.dense_4h_to_h. The
           linears are megatron.core's, so they too write `_extra_state: None` (since efbfb5f05e,
           2023-12-19).
  [OPT]    megatron/core/optimizer/__init__.py _get_param_groups before 9a45638758 (2025-07):
           groups keyed by (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr) in order of first
           appearance over named_parameters, no_wd = name.endswith('.bias') or 1-D, dict keys
           params, wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr, then max_lr, min_lr
           (_update_min_and_max_lr_in_param_groups); torch's AdamW is Megatron's fallback Adam.
           (Later versions differ: 9a45638758 gives every rank every group, possibly empty;
           41cedd6277 (2026-01) sorts them, the decaying group first on every stage.)
           Megatron's default Adam is Transformer Engine's (or apex's) FusedAdam, which keeps
           'step' as an int in each param group (fused_adam=True mimics that state).
           optimizer.py Float16OptimizerWithFloat16Params: fp32 main params
           `param.detach().clone().float()` replace the bf16 ones in the groups; state_dict() =
           {'optimizer': inner.state_dict(), ['grad_scaler' (fp16 only)], 'fp32_from_fp16_params':
           fp32_from_float16_groups}. optimizer_param_scheduler.py state_dict keys.
  [VOCAB]  megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding (multiple =
           make_vocab_size_divisible_by * TP); tools/checkpoint/saver_base.py pad_weight (cut, or
           repeat the last row).
  [ARGS]   megatron/training/arguments.py: --num-query-groups defaults to 1 (read only with
           --group-query-attention), --vocab-size defaults to None, --disable-bias-linear is
           add_bias_linear, params_dtype torch.bfloat16 with --bf16,
           transformer_pipeline_model_parallel_size, world_size, data_parallel_size.
  [TORCH]  torch.nn.Module.state_dict returns an OrderedDict carrying `_metadata` ({module prefix:
           {'version': 1}}); torch 1.13 AdamW state is {'step': float32 scalar tensor (CPU),
           'exp_avg', 'exp_avg_sq'}, param_groups list 'params' last.
"""
import argparse
import collections
import copy
import math
import os
import random
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import megatron_distopt
import sharing

TRACKER = "latest_checkpointed_iteration.txt"
FILE = "model_optim_rng.pt"
DISTRIB_FILE = "distrib_optim.pt"


# ------------------------------------------------------------------------------------------------
# Model configuration
# ------------------------------------------------------------------------------------------------

@dataclass
class ModelConfig:
    era: str = "mcore"              # "mcore" or "legacy" parameter names
    num_layers: int = 4
    hidden_size: int = 64
    num_attention_heads: int = 8
    num_query_groups: int = 0       # 0: no GQA (args: group_query_attention False, groups 1)
    ffn_hidden_size: int = 128
    swiglu: bool = False
    vocab_size: int = 1000
    make_vocab_size_divisible_by: int = 96
    untie: bool = False             # args.untie_embeddings_and_output_weights
    bias: bool = True               # args.add_bias_linear
    qkv_bias: bool = False          # args.add_qkv_bias: a bias on linear_qkv only (Qwen2)
    qk_layernorm: bool = False      # args.qk_layernorm: per-head q/k norms (Qwen3; mcore only)
    window_size: tuple = None       # args.window_size (left, right): sliding-window attention
    normalization: str = "LayerNorm"  # or "RMSNorm" (weight only)
    position_embedding_type: str = "learned_absolute"  # or "rope" (no position_embeddings)
    max_position_embeddings: int = 32
    args_vocab_size: bool = True    # False: args.vocab_size is None, as when a tokenizer sets it
    extra_state: str = "none"       # "none": None (megatron.core linears), "empty": uint8 (TE)
    data_parallel_size: int = 2
    seed: int = 1234
    # Marks that make the view rules observable (off: every value as Megatron would write it).
    distinct_steps: bool = False    # Adam 'step' differs per source rank and parameter
    skew_replicas: bool = False     # TP rank r > 0 holds replicated tensors + r/8
    skew_head: bool = False         # the tied head copy differs from the word embeddings
    mystery: bool = False           # layer 0 gets a parameter no rule covers: mystery.weight [h, h]
    cuda_locations: bool = False    # model and optimizer tensors recorded as cuda:N (N = rank % 8)
    sorted_groups: bool = False     # megatron.core since 2026-01: param groups sorted, weight
                                    # decay (wd_mult 1) first on every stage
    fused_adam: bool = False        # Transformer Engine / apex FusedAdam's state: 'step' an int in
                                    # each param group, per-parameter state exp_avg, exp_avg_sq only
    distributed_optimizer: bool = False  # --use-distributed-optimizer: the parameter state in
                                    # distrib_optim.pt (megatron_distopt.py); bucketing from
                                    # extra_args overlap_grad_reduce, ddp_bucket_size, ...
    # More args fields, or other values (None: the field is left out, as args of another
    # Megatron version lack it, e.g. use_legacy_models since 2026).
    extra_args: dict = field(default_factory=dict)

    @property
    def gqa(self):
        return self.num_query_groups > 0

    @property
    def groups(self):
        return self.num_query_groups if self.gqa else self.num_attention_heads

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def tied(self):
        return not self.untie

    def padded_vocab(self, tp):
        # [VOCAB] vocab_size_with_padding
        multiple = self.make_vocab_size_divisible_by * tp
        return int(math.ceil(self.vocab_size / multiple) * multiple)

    def check(self, tp, pp):
        h, n, g, f = self.hidden_size, self.num_attention_heads, self.groups, self.ffn_hidden_size
        assert h % n == 0 and n % g == 0, (h, n, g)
        # [MCORE] transformer_config: num_query_groups a multiple or a divisor of TP; [LEGACY]
        # ParallelAttention: a multiple only.
        groups_ok = g % tp == 0 or (self.era == "mcore" and tp % g == 0 and
                                    ((n + 2 * g) * self.head_dim) % tp == 0)
        assert n % tp == 0 and groups_ok and f % tp == 0, f"TP {tp} does not fit {self}"
        assert self.num_layers % pp == 0, f"PP {pp} does not divide {self.num_layers}"


# ------------------------------------------------------------------------------------------------
# Generator: the full model
# ------------------------------------------------------------------------------------------------

def _gen(*key):
    g = torch.Generator()
    g.manual_seed(zlib.crc32("/".join(str(k) for k in key).encode()))
    return g


class FullModel:
    """Deterministic random tensors of the whole model, per canonical parameter, component
    (q/k/v, gate/up, or 'w') and kind: 'master' (the fp32 main copy; the bf16 weight is its
    rounding, as Float16Optimizer's copy to the model gives), 'exp_avg', 'exp_avg_sq'."""

    KINDS = ("master", "exp_avg", "exp_avg_sq")

    def __init__(self, cfg):
        self.cfg = cfg
        self._cache = {}
        # The word-embedding tables are drawn once at their largest padded size; every padded
        # size is a prefix of it.
        self.vocab_rows = max(cfg.padded_vocab(t) for t in range(1, 65))

    def tensor(self, canon, comp, kind, shape):
        key = (canon, comp, kind)
        if key not in self._cache:
            g = _gen(self.cfg.seed, canon, comp, kind)
            if kind == "master":
                t = torch.randn(shape, generator=g) * 0.05
            elif kind == "exp_avg":
                t = torch.randn(shape, generator=g) * 1e-3
            else:
                t = torch.rand(shape, generator=g) * 1e-5
            self._cache[key] = t
        return self._cache[key]


# Per-layer parameters: (canonical id, name in the layer, generator kind) in state-dict order.
#   norm / rowbias: replicated; qkv: fused per query group; fc1: column (SwiGLU: gate and up);
#   row: dim 1.
def layer_params(cfg, era):
    nb = cfg.normalization == "LayerNorm"
    b = cfg.bias
    norm = lambda c, m, g: [(f"{c}.w", f"{m}.weight", f"{g}.weight", "norm")] + (
        [(f"{c}.b", f"{m}.bias", f"{g}.bias", "norm")] if nb else [])
    lin = lambda c, m, g, kind, bkind: [(f"{c}.w", f"{m}.weight", f"{g}.weight", kind)] + (
        [(f"{c}.b", f"{m}.bias", f"{g}.bias", bkind)] if b else []) + [
        (f"{c}.x", f"{m}._extra_state", f"{g}._extra_state", "extra")]
    in_norm = norm("in_norm", "input_layernorm", "input_norm")
    qkv = lin("qkv", "self_attention.linear_qkv", "self_attention.query_key_value", "qkv", "qkv")
    if cfg.qkv_bias and not b:  # [MCORE] attention.py: bias=add_bias_linear or add_qkv_bias
        qkv.insert(1, ("qkv.b", "self_attention.linear_qkv.bias",
                       "self_attention.query_key_value.bias", "qkv"))
    qk_norms = []
    if cfg.qk_layernorm:  # [MCORE] SelfAttention: q_layernorm, k_layernorm after linear_qkv
        assert era == "mcore", "qk_layernorm is megatron.core's"
        qk_norms = (norm("q_norm", "self_attention.q_layernorm", None) +
                    norm("k_norm", "self_attention.k_layernorm", None))
    proj = lin("proj", "self_attention.linear_proj", "self_attention.dense", "row", "rowbias")
    mlp_norm = norm("mlp_norm", "pre_mlp_layernorm", "post_attention_norm")
    fc1 = lin("fc1", "mlp.linear_fc1", "mlp.dense_h_to_4h", "fc1", "fc1")
    fc2 = lin("fc2", "mlp.linear_fc2", "mlp.dense_4h_to_h", "row", "rowbias")
    if era == "mcore":  # [MCORE] linear_proj is registered before linear_qkv
        order = in_norm + proj + qkv + qk_norms + mlp_norm + fc1 + fc2
    else:               # [LEGACY] query_key_value before dense
        order = in_norm + qkv + proj + mlp_norm + fc1 + fc2
    return [(c, mcore if era == "mcore" else legacy, kind) for c, mcore, legacy, kind in order]


def param_shape(cfg, canon):
    """Full (unsharded) shape per component for a canonical parameter id."""
    h, f, hd = cfg.hidden_size, cfg.ffn_hidden_size, cfg.head_dim
    part = canon.split(".", 1)[1] if canon[0].isdigit() else canon
    if part in ("q_norm.w", "q_norm.b", "k_norm.w", "k_norm.b"):
        return {"w": (hd,)}
    if part in ("in_norm.w", "in_norm.b", "mlp_norm.w", "mlp_norm.b", "final_norm.w",
                "final_norm.b", "proj.b", "fc2.b"):
        return {"w": (h,)}
    if part == "qkv.w":
        return {"q": (cfg.num_attention_heads * hd, h), "k": (cfg.groups * hd, h),
                "v": (cfg.groups * hd, h)}
    if part == "qkv.b":
        return {"q": (cfg.num_attention_heads * hd,), "k": (cfg.groups * hd,),
                "v": (cfg.groups * hd,)}
    if part in ("fc1.w", "fc1.b"):
        shape = (f, h) if part == "fc1.w" else (f,)
        return {"gate": shape, "up": shape} if cfg.swiglu else {"w": shape}
    if part == "proj.w":
        return {"w": (h, cfg.num_attention_heads * hd)}
    if part == "fc2.w":
        return {"w": (h, f)}
    if part == "mystery.w":
        return {"w": (h, h)}
    if part == "pos":
        return {"w": (cfg.max_position_embeddings, h)}
    raise KeyError(canon)


REPLICATED_KINDS = ("norm", "rowbias", "pos", "mystery")


def local_shard(full, canon, kind, gkind, tps, tp_rank):
    """The TP shard of canonical parameter `canon` (a `kind` tensor) on rank tp_rank of tps, built
    from the model's own pieces the way Megatron lays them out (not by the view's rules)."""
    cfg = full.cfg
    if gkind == "vocab":  # word embeddings, output layer, head copy: the padded table, dim 0
        base = "word" if canon == "head" else canon
        table = full.tensor(base, "w", kind, (full.vocab_rows, cfg.hidden_size))
        if canon == "head" and cfg.skew_head:
            table = table + 0.5 if kind != "exp_avg_sq" else table * 2
        per = cfg.padded_vocab(tps) // tps
        return table[tp_rank * per:(tp_rank + 1) * per].clone()
    shapes = param_shape(cfg, canon)
    comps = {c: full.tensor(canon, c, kind, s) for c, s in shapes.items()}
    if gkind in REPLICATED_KINDS:
        t = comps["w"].clone()
        if cfg.skew_replicas and tp_rank > 0:
            t = t + tp_rank / 8
        return t
    if gkind == "qkv":
        # [MCORE]/[LEGACY] rows per query group: its heads/groups query heads, then k, then v;
        # TP rank r holds the r-th of T equal dim-0 chunks of that (ColumnParallelLinear): whole
        # groups when T divides the groups, part of one group's rows when T is a multiple of them.
        hd, qh = cfg.head_dim, cfg.num_attention_heads // cfg.groups
        out = []
        for g in range(cfg.groups):
            out += [comps["q"][g * qh * hd:(g + 1) * qh * hd], comps["k"][g * hd:(g + 1) * hd],
                    comps["v"][g * hd:(g + 1) * hd]]
        return torch.cat(out).chunk(tps)[tp_rank].clone()
    if gkind == "fc1":
        if cfg.swiglu:  # [MCORE] mlp.py / [LEGACY] ParallelMLP: shard r = [gate_r; up_r]
            return torch.cat([comps["gate"].chunk(tps)[tp_rank],
                              comps["up"].chunk(tps)[tp_rank]]).clone()
        return comps["w"].chunk(tps)[tp_rank].clone()
    if gkind == "row":
        return comps["w"].chunk(tps, dim=1)[tp_rank].clone()
    raise KeyError(gkind)


# ------------------------------------------------------------------------------------------------
# Generator: one rank's state dict
# ------------------------------------------------------------------------------------------------

def _module_metadata(keys):
    """The `_metadata` torch.nn.Module.state_dict attaches: {module prefix: {'version': 1}} for the
    root and every module on the way to a key, in visiting order [TORCH]. (Modules without state,
    such as dropouts, are left out: the view only has to carry whatever the file holds.)"""
    md = collections.OrderedDict()
    md[""] = {"version": 1}
    for k in keys:
        parts = k.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            md.setdefault(".".join(parts[:i]), {"version": 1})
    return md


def _state_dict(items):
    sd = collections.OrderedDict(items)
    sd._metadata = _module_metadata(sd.keys())
    return sd


def rank_model(full, tps, pps, t, p):
    """[(path tuple, value, canon, gkind)] of rank (t, p) in Megatron's state-dict order."""
    cfg = full.cfg
    per = cfg.num_layers // pps
    first, last = p == 0, p == pps - 1
    era = cfg.era
    lp = layer_params(cfg, era)
    extra = (lambda: None) if cfg.extra_state == "none" else (
        lambda: torch.empty(0, dtype=torch.uint8))
    out = []
    if era == "mcore":
        def add(key, canon, gkind):
            out.append(((key,), canon, gkind))
        if first:
            add("embedding.word_embeddings.weight", "word", "vocab")
            if cfg.position_embedding_type == "learned_absolute":
                add("embedding.position_embeddings.weight", "pos", "pos")
        for i in range(per):
            g = p * per + i
            for c, name, kind in lp:
                add(f"decoder.layers.{i}.{name}", f"{g}.{c}", kind)
            if cfg.mystery and g == 0:
                add(f"decoder.layers.{i}.mystery.weight", "0.mystery.w", "mystery")
        if last:
            add("decoder.final_layernorm.weight", "final_norm.w", "norm")
            if cfg.normalization == "LayerNorm":
                add("decoder.final_layernorm.bias", "final_norm.b", "norm")
            if cfg.untie:
                add("output_layer.weight", "out", "vocab")
            elif pps > 1:  # [MCORE] the head's copy of the tied embeddings
                add("output_layer.weight", "head", "vocab")
            add("output_layer._extra_state", "out.x", "extra")
    else:
        def add(path, canon, gkind):
            out.append((path, canon, gkind))
        if first:
            add(("language_model", "embedding", "word_embeddings", "weight"), "word", "vocab")
            if cfg.position_embedding_type == "learned_absolute":
                add(("language_model", "embedding", "position_embeddings", "weight"), "pos", "pos")
        for i in range(per):
            g = p * per + i
            for c, name, kind in lp:
                add(("language_model", "encoder", f"layers.{i}.{name}"), f"{g}.{c}", kind)
            if cfg.mystery and g == 0:
                add(("language_model", "encoder", f"layers.{i}.mystery.weight"), "0.mystery.w",
                    "mystery")
        if last:
            add(("language_model", "encoder", "final_norm.weight"), "final_norm.w", "norm")
            if cfg.normalization == "LayerNorm":
                add(("language_model", "encoder", "final_norm.bias"), "final_norm.b", "norm")
            if cfg.untie:
                add(("language_model", "output_layer", "weight"), "out", "vocab")
                add(("language_model", "output_layer", "_extra_state"), "out.x", "extra")
            elif not first:  # [LEGACY] gpt_model.state_dict_for_save_checkpoint
                add(("word_embeddings_for_head", "weight"), "head", "vocab")
    entries = []
    for path, canon, gkind in out:
        if gkind == "extra":
            entries.append((path, extra(), canon, gkind))
        else:
            entries.append((path, None, canon, gkind))
    return entries


def _nest_legacy(flat):
    """Legacy nesting: plain dicts, each nn.Module.state_dict an OrderedDict with _metadata."""
    model = {}
    groups = collections.OrderedDict()
    for path, v in flat:
        groups.setdefault(path[:-1], []).append((path[-1], v))
    for prefix, items in groups.items():
        d = model
        for k in prefix[:-1]:
            d = d.setdefault(k, {})
        d[prefix[-1]] = _state_dict(items)
    return model


def _rng_state(seed):
    """[RNG]/[CKPT] get_rng_state: a one-element list (no data_parallel_random_init)."""
    r = random.Random(seed)
    npr = np.random.RandomState(seed % (2 ** 32))
    g = torch.Generator()
    g.manual_seed(seed)
    cuda_state = lambda s: torch.tensor(list((s * 2654435761 + i) % 256 for i in range(16)),
                                        dtype=torch.uint8)
    return [{
        "random_rng_state": r.getstate(),
        "np_rng_state": npr.get_state(),
        "torch_rng_state": g.get_state(),
        "cuda_rng_state": cuda_state(seed),  # torch.cuda.get_rng_state() is a CPU ByteTensor
        "rng_tracker_states": {"data-parallel-rng": cuda_state(seed + 1),
                               "model-parallel-rng": cuda_state(seed + 2),
                               "expert-parallel-rng": cuda_state(seed + 3)},
    }]


LR, MIN_LR, WD = 3e-4, 3e-5, 0.1


def make_args(cfg, tps, pps, iteration):
    """[ARGS] the fields of Megatron's args a loader reads (a subset of the real Namespace)."""
    ns = argparse.Namespace()
    a = dict(
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.ffn_hidden_size, num_attention_heads=cfg.num_attention_heads,
        group_query_attention=cfg.gqa, num_query_groups=cfg.num_query_groups if cfg.gqa else 1,
        kv_channels=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
        rotary_base=10000, rotary_percent=1.0, norm_epsilon=1e-5,
        position_embedding_type=cfg.position_embedding_type, add_position_embedding=True,
        make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by,
        vocab_size=cfg.vocab_size if cfg.args_vocab_size else None,
        normalization=cfg.normalization, swiglu=cfg.swiglu,
        untie_embeddings_and_output_weights=cfg.untie, add_bias_linear=cfg.bias,
        add_qkv_bias=cfg.bias or cfg.qkv_bias, qk_layernorm=cfg.qk_layernorm,
        window_size=cfg.window_size, tensor_model_parallel_size=tps, pipeline_model_parallel_size=pps,
        virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
        expert_model_parallel_size=1, sequence_parallel=False,
        use_distributed_optimizer=cfg.distributed_optimizer, overlap_grad_reduce=False,
        ddp_bucket_size=None, ddp_num_buckets=None, ddp_pad_buckets_for_high_nccl_busbw=False,
        accumulate_allreduce_grads_in_fp32=True,
        world_size=tps * pps * cfg.data_parallel_size, rank=0,
        transformer_pipeline_model_parallel_size=pps, data_parallel_size=cfg.data_parallel_size,
        bf16=True, fp16=False, params_dtype=torch.bfloat16, optimizer="adam", lr=LR, min_lr=MIN_LR,
        weight_decay=WD, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, seed=cfg.seed,
        micro_batch_size=1, global_batch_size=8, seq_length=cfg.max_position_embeddings,
        train_iters=10 * max(iteration, 1), ckpt_format="torch",
        use_legacy_models=cfg.era == "legacy", use_mcore_models=cfg.era == "mcore",
        tokenizer_type="GPT2BPETokenizer", save="/ckpt", load="/ckpt", no_save_optim=False,
        no_save_rng=False, data_parallel_random_init=False,
        padded_vocab_size=cfg.padded_vocab(tps))
    a.update(cfg.extra_args)
    for k, v in a.items():
        if v is not None or k not in cfg.extra_args:
            setattr(ns, k, v)
    return ns


def _no_wd(name, t):
    return name.endswith(".bias") or t.dim() == 1  # [OPT] _get_param_groups


def build_rank(full, tps, pps, t, p, iteration):
    """The state dict Megatron's save_checkpoint writes on rank (t, p), and the set of storages
    that a GPU run would have placed on cuda:N (model and optimizer tensors)."""
    cfg = full.cfg
    rank = t + tps * p
    entries = rank_model(full, tps, pps, t, p)
    flat, params = [], []  # params: (name, bf16 weight, canon, gkind)
    for path, extra, canon, gkind in entries:
        if gkind == "extra":
            flat.append((path, extra))
            continue
        master = local_shard(full, canon, "master", gkind, tps, t)
        w = master.to(torch.bfloat16)
        flat.append((path, w))
        params.append((".".join(path), w, canon, gkind, master))
    if cfg.era == "mcore":
        model = _state_dict([(path[0], v) for path, v in flat])
    else:
        model = _nest_legacy(flat)

    # [OPT] groups by (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr), first appearance.
    groups = collections.OrderedDict()
    for i, (name, w, canon, gkind, master) in enumerate(params):
        groups.setdefault(0.0 if _no_wd(name, w) else 1.0, []).append(i)
    if cfg.sorted_groups:  # [OPT] newer _get_param_groups sorts the groups by their key
        groups = collections.OrderedDict(sorted(groups.items(), key=lambda kv: -kv[0]))
    pg = []
    masters = {}
    for wd_mult, idxs in groups.items():
        ms = []
        for i in idxs:
            m = params[i][4]
            masters[i] = m
            ms.append(m)
        pg.append({"params": ms, "wd_mult": wd_mult, "lr_mult": 1.0, "is_expert_parallel": False,
                   "is_decoupled_lr": False, "max_lr": LR, "min_lr": MIN_LR})
    opt = torch.optim.AdamW(pg, lr=LR, weight_decay=WD, betas=(0.9, 0.95), eps=1e-8)
    lr_now = LR * 0.5
    for g in opt.param_groups:  # what OptimizerParamScheduler.step leaves in the groups
        g["lr"] = lr_now * g["lr_mult"]
        g["weight_decay"] = WD * g["wd_mult"]
    k = 0
    for wd_mult, idxs in groups.items():
        for i in idxs:
            name, w, canon, gkind, master = params[i]
            step = float(iteration)
            if cfg.distinct_steps:  # replicated parameters: the same on every TP rank
                r = tps * p if gkind in REPLICATED_KINDS and not cfg.skew_replicas else rank
                step = float(iteration + 1000 * (r + 1) + k)
            opt.state[master] = {
                "step": torch.tensor(step),
                "exp_avg": local_shard(full, canon, "exp_avg", gkind, tps, t),
                "exp_avg_sq": local_shard(full, canon, "exp_avg_sq", gkind, tps, t),
            }
            k += 1
    inner = opt.state_dict()
    if cfg.fused_adam:  # [OPT] transformer_engine/pytorch/optimizers/fused_adam.py step()
        for st in inner["state"].values():
            del st["step"]
        for i, g in enumerate(inner["param_groups"]):
            params_ = g.pop("params")
            g["bias_correction"] = True
            g["step"] = iteration
            g["params"] = params_
    optimizer = {"optimizer": inner,
                 "fp32_from_fp16_params": [[masters[i] for i in idxs] for idxs in groups.values()]}
    distrib = None
    if cfg.distributed_optimizer:
        states = {"param": [p_[4] for p_ in params],
                  "exp_avg": [opt.state[p_[4]]["exp_avg"] for p_ in params],
                  "exp_avg_sq": [opt.state[p_[4]]["exp_avg_sq"] for p_ in params]}
        optimizer, distrib, _ = megatron_distopt.rank_state(
            cfg, pps, p, [(p_[0], p_[1].numel()) for p_ in params], states,
            opt.state_dict()["param_groups"], iteration)
    sched = {"max_lr": LR, "lr_warmup_steps": 10, "num_steps": iteration * 8,
             "lr_decay_style": "cosine", "lr_decay_steps": 80 * max(iteration, 1),
             "min_lr": MIN_LR, "start_wd": WD, "end_wd": WD, "wd_incr_style": "constant",
             "wd_incr_steps": 80 * max(iteration, 1)}
    sd = {  # [CKPT] generate_state_dict order, then num_floating_point_operations_so_far
        "args": make_args(cfg, tps, pps, iteration),
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "model": model,
        "optimizer": optimizer,
        "opt_param_scheduler": sched,
        "rng_state": _rng_state(cfg.seed * 1000 + rank),
        "num_floating_point_operations_so_far": 123456789.0 * iteration,
    }
    on_gpu = [p_[1] for p_ in params]
    if not cfg.distributed_optimizer:
        on_gpu += list(masters.values())
        for st in optimizer["optimizer"]["state"].values():
            on_gpu += [st["exp_avg"], st["exp_avg_sq"]]
    return sd, on_gpu, distrib


class _LocationTagger:
    """Makes torch.save record the given location for given tensors' storages ({data_ptr:
    'cuda:N'}), as a save from GPU memory does, without a GPU (torch.serialization's
    register_package; removed again on exit)."""

    def __init__(self, where):
        self.where = where

    def __enter__(self):
        import torch.serialization as ser
        self.entry = (1, lambda obj: self.where.get(obj.data_ptr()), lambda obj, loc: None)
        ser._package_registry.append(self.entry)
        ser._package_registry.sort(key=lambda e: e[0])
        return self

    def __exit__(self, *exc):
        import torch.serialization as ser
        ser._package_registry.remove(self.entry)


def rank_name(t, p, pps):
    """[CKPT] get_checkpoint_name: mp_rank_TT, or mp_rank_TT_PPP with pipeline parallelism."""
    return f"mp_rank_{t:02d}" if pps == 1 else f"mp_rank_{t:02d}_{p:03d}"


def rank_dir(root, iteration, t, p, pps, release=False):
    d = "release" if release else f"iter_{iteration:07d}"
    return Path(root) / d / rank_name(t, p, pps)


def save_checkpoint(root, cfg, tp, pp, iteration=100, release=False, full=None):
    """Writes the checkpoint of cfg's model for TP=tp, PP=pp under root; returns the FullModel."""
    cfg.check(tp, pp)
    full = full or FullModel(cfg)
    for p in range(pp):
        for t in range(tp):
            sd, on_gpu, distrib = build_rank(full, tp, pp, t, p, iteration)
            d = rank_dir(root, iteration, t, p, pp, release)
            d.mkdir(parents=True, exist_ok=True)
            if cfg.cuda_locations:
                dev = f"cuda:{(t + tp * p) % 8}"
                with _LocationTagger({x.storage().data_ptr(): dev for x in on_gpu if x.numel()}):
                    torch.save(sd, d / FILE)
            else:
                torch.save(sd, d / FILE)
            if distrib is not None:  # [SAVE] of megatron_distopt.py
                torch.save(distrib, d / DISTRIB_FILE)
    with open(Path(root) / TRACKER, "w") as f:  # [CKPT] save_checkpoint: str(iteration)
        f.write("release" if release else str(iteration))
    return full


# ------------------------------------------------------------------------------------------------
# Loading, with storage locations
# ------------------------------------------------------------------------------------------------

class Loaded:
    """A torch.load result and the location each tensor's storage was saved with."""

    def __init__(self, path):
        seen = {}

        def record(storage, location):
            seen[storage.data_ptr()] = location
            return storage

        with open(path, "rb") as f:
            self.obj = torch.load(f, map_location=record)
        self.seen = seen

    def location(self, t):
        return self.seen.get(t.storage().data_ptr()) if t.numel() else None


def read_tracker(root):
    return (Path(root) / TRACKER).read_text().strip()


def iteration_dir_name(root):
    s = read_tracker(root)
    return "release" if s == "release" else f"iter_{int(s):07d}"


def rank_files(root, dirname=None):
    """{(t, p): path} of one iteration directory; the TP and PP sizes."""
    dirname = dirname or iteration_dir_name(root)
    out = {}
    for d in sorted((Path(root) / dirname).iterdir()):
        m = re.fullmatch(r"mp_rank_(\d\d)(?:_(\d\d\d))?", d.name)
        if m:
            out[(int(m.group(1)), int(m.group(2) or 0))] = d / FILE
    tps = 1 + max(t for t, _ in out)
    pps = 1 + max(p for _, p in out)
    assert len(out) == tps * pps, f"incomplete: {sorted(out)}"
    return out, tps, pps


# ------------------------------------------------------------------------------------------------
# REFERENCE: the rules of docs/views.md, applied to the source files
# ------------------------------------------------------------------------------------------------

class ViewError(ValueError):
    """The view cannot be made (docs/views.md: the lookup fails with EINVAL)."""


UNCHECKED = "_ref_metadata_unchecked"  # on an expected OrderedDict: its _metadata is not checked


class Loose(collections.OrderedDict):
    """An expected container no source file has (the synthesized head copy's): any dict type and
    any _metadata will do."""

_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


def rule_of(name, swiglu):
    """docs/views.md 'Parameter names': the rule a key path (without 'model.') falls under."""
    last = name.rsplit(".", 1)[-1]
    if last == "_extra_state":
        return "extra"
    ends = lambda *s: any(name == x or name.endswith("." + x) for x in s)
    if ends("query_key_value.weight", "query_key_value.bias", "linear_qkv.weight",
            "linear_qkv.bias"):
        return "column"
    if ends("dense_h_to_4h.weight", "dense_h_to_4h.bias", "linear_fc1.weight", "linear_fc1.bias"):
        return "swiglu" if swiglu else "column"
    if ends("self_attention.dense.weight", "linear_proj.weight", "dense_4h_to_h.weight",
            "linear_fc2.weight"):
        return "row"
    if ends("word_embeddings.weight", "output_layer.weight", "word_embeddings_for_head.weight"):
        return "vocab"
    module = name.rsplit(".", 1)[0] if "." in name else ""
    if (last in ("weight", "bias") and "norm" in module.rsplit(".", 1)[-1]) or \
            last in ("layer_norm_weight", "layer_norm_bias"):
        return "replicated"
    if ends("dense.bias", "linear_proj.bias", "dense_4h_to_h.bias", "linear_fc2.bias",
            "position_embeddings.weight"):
        return "replicated"
    raise ViewError(f"no rule for parameter model.{name}")


def section_of(name):
    if name.startswith("embedding.") or name.startswith("language_model.embedding."):
        return "embedding"
    if _LAYER.search(name):
        return "layer"
    if "final_norm." in name or "final_layernorm." in name:
        return "final"
    if name.startswith("output_layer.") or name.startswith("language_model.output_layer."):
        return "output"
    if name.startswith("word_embeddings_for_head."):
        return "head"
    raise ViewError(f"parameter model.{name} belongs to no pipeline stage")


def _is_extra(path):
    return path[-1].rsplit(".", 1)[-1] == "_extra_state"


def _walk(obj, path=()):
    """Leaves of a model dict: (path tuple, value); containers are dicts."""
    for k, v in obj.items():
        if isinstance(v, dict):
            yield from _walk(v, path + (k,))
        else:
            yield path + (k,), v


def _renumber(path, layer_to):
    """Replaces the layer number in the key that holds it."""
    out = []
    for k in path:
        m = _LAYER.search(k)
        if m:
            k = k[:m.start(2)] + str(layer_to) + k[m.end(2):]
        out.append(k)
    return tuple(out)


def _layer_no(name):
    m = _LAYER.search(name)
    return int(m.group(2)) if m else None


def _get_container(model, path):
    d = model
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, dict) else None


class _Source:
    """The source iteration: every rank file, its model leaves, optimizer bookkeeping."""

    def __init__(self, root, dirname=None):
        files, self.T, self.P = rank_files(root, dirname)
        self.loaded = {k: Loaded(v) for k, v in files.items()}
        self.sd = {k: v.obj for k, v in self.loaded.items()}
        a = self.sd[(0, 0)]["args"]
        for k in ("num_layers", "hidden_size", "num_attention_heads"):
            if not hasattr(a, k):
                raise ViewError(f"args has no {k}")
        self.args = a
        self.L = a.num_layers
        self.heads = a.num_attention_heads
        self.groups = a.num_query_groups if getattr(a, "group_query_attention", False) else \
            self.heads
        self.ffn = getattr(a, "ffn_hidden_size", None)
        self.swiglu = bool(getattr(a, "swiglu", False))
        self.tied = not getattr(a, "untie_embeddings_and_output_weights", False)
        for k, sd in self.sd.items():
            if any(x.startswith("model") and x != "model" for x in sd):
                raise ViewError("virtual pipeline checkpoints are refused")
        self._params, self._pdict = {}, {}
        self.opt = {k: self._opt_map(k) for k in self.sd}

    def is_head(self, name):
        if name.startswith("word_embeddings_for_head."):
            return True
        return self.tied and name == "output_layer.weight"

    def global_name(self, name, p):
        n = _layer_no(name)
        if n is None:
            return name
        return ".".join(_renumber((name,), n + p * (self.L // self.P)))

    def params(self, key):
        """[(name, tensor)] of a rank's model tensors in key order (not _extra_state)."""
        if key not in self._params:
            self._params[key] = [(".".join(path), v) for path, v in _walk(self.sd[key]["model"])
                                 if isinstance(v, torch.Tensor) and not _is_extra(path)]
        return self._params[key]

    def param_dict(self, key):
        if key not in self._pdict:
            self._pdict[key] = dict(self.params(key))
        return self._pdict[key]

    def _opt_map(self, key):
        """{param name: (master or None, state dict, group index)} of one rank."""
        sd = self.sd[key]
        if "optimizer" not in sd:
            return {}
        outer = sd["optimizer"]
        fp16 = "fp32_from_fp16_params" in outer
        inner = outer["optimizer"] if fp16 else outer
        groups = inner["param_groups"]
        nowd = [g["wd_mult"] == 0 if "wd_mult" in g else g["weight_decay"] == 0 for g in groups]
        fill = [0] * len(groups)
        out = {}
        for name, t in self.params(key):
            cls = _no_wd(name, t)
            for gi, g in enumerate(groups):
                if nowd[gi] == cls and fill[gi] < len(g["params"]):
                    break
            else:
                raise ViewError(f"rank {key}: no optimizer group left for model.{name}")
            j = fill[gi]
            fill[gi] += 1
            idx = g["params"][j]
            master = outer["fp32_from_fp16_params"][gi][j] if fp16 else None
            if master is not None and master.shape != t.shape:
                raise ViewError(f"rank {key}: fp32 master of model.{name} is {list(master.shape)}")
            state = inner["state"].get(idx, {})
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != t.shape:
                    raise ViewError(f"rank {key}: optimizer state {k} of model.{name} is "
                                    f"{list(v.shape)}, the parameter {list(t.shape)}")
            out[name] = (master, state, gi)
        return out


def join_shards(rule, parts):
    """The full tensor of a parameter under `rule` from its TP shards, in rank order."""
    if rule in ("column", "vocab"):
        return torch.cat(parts, 0)
    if rule == "row":
        return torch.cat(parts, 1)
    if rule == "swiglu":
        halves = [x.chunk(2, 0) for x in parts]
        return torch.cat([torch.cat([a for a, _ in halves]), torch.cat([b for _, b in halves])])
    return parts[0]  # replicated: source TP rank 0


def split_full(rule, x, T, t, rows=None):
    """Shard t of T of full tensor x under `rule` (`rows`: the padded vocabulary, for vocab)."""
    if rule == "vocab":
        n = x.shape[0]
        if rows <= n:  # docs 'Vocabulary padding' / [VOCAB] pad_weight
            x = x[:rows]
        else:
            x = torch.cat([x, x[-1:].expand(rows - n, *x.shape[1:])])
        return x.chunk(T, 0)[t].clone()
    if rule == "column":
        return x.chunk(T, 0)[t].clone()
    if rule == "row":
        return x.chunk(T, 1)[t].clone()
    if rule == "swiglu":
        g, u = x.chunk(2, 0)
        return torch.cat([g.chunk(T, 0)[t], u.chunk(T, 0)[t]]).clone()
    return x.clone()


class _Full:
    """One parameter assembled from its TP shards on its source stage: for each tensor kind
    ('weight', 'master', state keys of the parameter's shape) the full tensor, and per source TP
    rank the optimizer entry (for scalar state) and the locations."""

    def __init__(self, src, name, p, rule):
        self.rule, self.p, self.src = rule, p, src
        self.shards = []
        for t in range(src.T):
            w = src.param_dict((t, p))[name]
            master, state, _ = src.opt[(t, p)].get(name, (None, {}, None))
            self.shards.append((w, master, state))
        self.full = {"weight": self._join([s[0] for s in self.shards])}
        if self.shards[0][1] is not None:
            self.full["master"] = self._join([s[1] for s in self.shards])
        for k, v in self.shards[0][2].items():
            if isinstance(v, torch.Tensor) and v.shape == self.shards[0][0].shape:
                self.full[k] = self._join([s[2][k] for s in self.shards])
        self.locations = {}
        for kind in self.full:
            locs = set()
            for t, (w, master, state) in enumerate(self.shards):
                x = {"weight": w, "master": master}.get(kind, state.get(kind))
                locs.add(src.loaded[(t, p)].location(x))
            self.locations[kind] = locs

    def _join(self, parts):
        return join_shards(self.rule, parts)

    def split(self, kind, T, t, rows=None):
        return split_full(self.rule, self.full[kind], T, t, rows)

    def first_element_rank(self, T, t, rows=None):
        """The source TP rank holding the first element of target shard t."""
        Ts = self.src.T
        x = self.full["weight"]
        if self.rule == "vocab":
            r0 = t * (rows // T)
            return Ts - 1 if r0 >= x.shape[0] else r0 // (x.shape[0] // Ts)
        if self.rule == "column":
            return (t * (x.shape[0] // T)) // (x.shape[0] // Ts)
        if self.rule == "row":
            return (t * (x.shape[1] // T)) // (x.shape[1] // Ts)
        if self.rule == "swiglu":
            f = x.shape[0] // 2
            return (t * (f // T)) // (f // Ts)
        return 0


class Reference:
    """reference_shard's result: per target rank (t, p) the expected state dict; `locations`
    maps id(tensor) of an expected tensor to the storage locations the view may record for it."""

    def __init__(self, T, P, files, locations, tracker):
        self.T, self.P, self.files, self.locations, self.tracker = T, P, files, locations, tracker


def validate(src, T, P):
    """docs/views.md 'Target validity'."""
    spec = f"tp{T}-pp{P}"
    if T < 1 or P < 1:
        raise ViewError(f"view {spec}: sizes must be positive")
    if src.heads % T:
        raise ViewError(f"view {spec}: TP {T} does not divide num_attention_heads {src.heads}")
    if src.groups % T:
        # [MCORE] transformer_config: num_query_groups a multiple or a divisor of TP; then each
        # rank holds a plain dim-0 chunk of the fused QKV. [LEGACY] a multiple only.
        mcore = "language_model" not in src.sd[(0, 0)]["model"]  # the names tell the era
        kv = getattr(src.args, "kv_channels", None) or src.args.hidden_size // src.heads
        if not mcore or T % src.groups or ((src.heads + 2 * src.groups) * kv) % T:
            raise ViewError(f"view {spec}: TP {T} does not divide num_query_groups {src.groups}")
    if src.ffn is not None and src.ffn % T:
        raise ViewError(f"view {spec}: TP {T} does not divide ffn_hidden_size {src.ffn}")
    if src.L % P:
        raise ViewError(f"view {spec}: PP {P} does not divide num_layers {src.L}")


def padded_rows(src, T, src_rows):
    a = src.args
    v = getattr(a, "vocab_size", None)
    if v is None:  # absent (or None, Megatron's default): the source's padded size
        v = src_rows
    d = getattr(a, "make_vocab_size_divisible_by", None) or 1
    return int(math.ceil(v / (d * T)) * d * T)


def reference_shard(root, T, P, dirname=None):
    """The expected files of ROOT/.views/tpT-ppP/<iteration dir>/ (docs/views.md)."""
    src = _Source(root, dirname)
    validate(src, T, P)
    Ts, Ps, L = src.T, src.P, src.L
    fulls = {}
    # Every tensor leaf: its rule (unknown names fail here), its assembled full tensor.
    for p in range(Ps):
        for path, v in _walk(src.sd[(0, p)]["model"]):
            name = ".".join(path)
            rule = rule_of(name, src.swiglu)
            section_of(name)
            if rule != "extra" and isinstance(v, torch.Tensor):
                fulls[src.global_name(name, p)] = _Full(src, name, p, rule)
    word = next((n for n in fulls if n.endswith("word_embeddings.weight")
                 and not n.startswith("word_embeddings_for_head")), None)
    out, locations = {}, {}

    def target_stage(name, p_src):
        sec = section_of(name)
        if sec == "embedding":
            return 0
        if sec == "layer":
            return (_layer_no(name) + p_src * (L // Ps)) // (L // P)
        return P - 1

    for p in range(P):
        for t in range(T):
            ts, ps = t * Ts // T, p * Ps // P  # the primary source rank
            prim = src.sd[(ts, ps)]
            locs = {}
            model_items = []  # (target path, source path, source stage, value)
            for sp in range(Ps):
                m = src.sd[(ts, sp)]["model"]
                for path, v in _walk(m):
                    name = ".".join(path)
                    if target_stage(name, sp) != p:
                        continue
                    if src.is_head(name) and P == 1:
                        continue  # docs 'Pipeline stages': with P = 1 the head copy is not stored
                    n = _layer_no(name)
                    tpath = path
                    if n is not None:
                        g = n + sp * (L // Ps)
                        tpath = _renumber(path, g - p * (L // P))
                    model_items.append((tpath, path, sp, v))
            need_head = src.tied and P > 1 and p == P - 1 and Ps == 1
            entries = []
            for tpath, path, sp, v in model_items:
                name = ".".join(path)
                if isinstance(v, torch.Tensor) and not _is_extra(path):
                    entries.append((tpath, ("param", fulls[src.global_name(name, sp)])))
                else:
                    entries.append((tpath, ("extra", v, sp)))
            if need_head:
                hf = fulls[word]
                legacy = word.startswith("language_model.")
                if legacy:
                    entries.append((("word_embeddings_for_head", "weight"), ("param", hf)))
                else:
                    # Megatron's own order puts output_layer.weight before output_layer._extra_state
                    at = next((i for i, (tp_, _) in enumerate(entries)
                               if tp_ == ("output_layer._extra_state",)), len(entries))
                    entries.insert(at, (("output_layer.weight",), ("param", hf)))
            # Tensors for the model; the optimizer's per-parameter pieces alongside.
            model = None
            params = []  # (name, weight, _Full, first-element source TP rank, vocab rows)
            for tpath, what in entries:
                if model is None:
                    model = _new_container(src, prim["model"], (), ts, ps)
                d = model
                for i, k in enumerate(tpath[:-1]):
                    if k not in d:
                        d[k] = _new_container(src, prim["model"], tpath[:i + 1], ts, ps)
                    d = d[k]
                if what[0] == "param":
                    full = what[1]
                    rows = padded_rows(src, T, full.full["weight"].shape[0]) \
                        if full.rule == "vocab" else None
                    w = full.split("weight", T, t, rows)
                    locs[id(w)] = full.locations["weight"]
                    d[tpath[-1]] = w
                    params.append((".".join(tpath), w, full, full.first_element_rank(T, t, rows),
                                   rows))
                else:
                    _, v, sp = what
                    d[tpath[-1]] = _pass(v, src.loaded[(ts, sp)], locs)
            if model is None:
                model = _new_container(src, prim["model"], (), ts, ps)
            target = {}
            for k, v in prim.items():
                if k == "model":
                    target[k] = model
                elif k == "optimizer":
                    target[k] = _target_optimizer(src, prim, (ts, ps), params, T, t, locs)
                elif k == "args":
                    target[k] = _rewrite_args(v, T, P, params)
                else:
                    target[k] = _pass(v, src.loaded[(ts, ps)], locs)
            out[(t, p)] = target
            locations[(t, p)] = locs
    tracker = (Path(root) / TRACKER).read_bytes()
    return Reference(T, P, out, locations, tracker)


def _new_container(src, prim_model, path, ts, ps):
    """A model container: its type from the first source file holding it, its _metadata from the
    primary source rank's (docs: the pickle's structure comes from the primary rank); a container
    the primary rank lacks gets its _metadata left unchecked."""
    kind = Loose
    for sp in range(src.P):
        c = _get_container(src.sd[(ts, sp)]["model"], path)
        if c is not None:
            kind = type(c)
            break
    d = kind()
    pc = _get_container(prim_model, path)
    if isinstance(d, collections.OrderedDict) and kind is not Loose:
        if pc is not None and hasattr(pc, "_metadata"):
            d._metadata = copy.deepcopy(pc._metadata)
        elif pc is None:
            setattr(d, UNCHECKED, True)
    return d


def _pass(v, loaded, locs):
    """A value passed through from a source file: a deep copy, tensors located like the source."""
    def visit(x, y):
        if isinstance(x, torch.Tensor):
            locs[id(y)] = {loaded.location(x)}
        elif isinstance(x, dict):
            for k in x:
                visit(x[k], y[k])
        elif isinstance(x, (list, tuple)):
            for a, b in zip(x, y):
                visit(a, b)
        elif isinstance(x, argparse.Namespace):
            visit(vars(x), vars(y))
    memo = {}
    y = copy.deepcopy(v, memo)
    visit(v, y)
    return y


def _rewrite_args(a, T, P, params):
    """docs 'Primary source rank': args rewritten."""
    a = copy.deepcopy(a)
    a.tensor_model_parallel_size = T
    a.pipeline_model_parallel_size = P
    if hasattr(a, "transformer_pipeline_model_parallel_size"):
        a.transformer_pipeline_model_parallel_size = P
    vocab = [rows for _, _, full, _, rows in params if rows is not None]
    if hasattr(a, "padded_vocab_size"):
        if vocab:
            a.padded_vocab_size = vocab[0]
        else:  # a stage without a vocabulary tensor: the same rule on the source's padded size
            a.padded_vocab_size = _padded_from_args(a, T)
    if hasattr(a, "world_size") and hasattr(a, "data_parallel_size"):
        a.world_size = T * P * a.data_parallel_size
    return a


def _padded_from_args(a, T):
    v = getattr(a, "vocab_size", None)
    if v is None:
        v = a.padded_vocab_size
    d = getattr(a, "make_vocab_size_divisible_by", None) or 1
    return int(math.ceil(v / (d * T)) * d * T)


def _sorted_groups(src, fp16):
    """docs 'Optimizer': a source stage >= 1 whose first parameter has no weight decay shows
    whether groups are sorted (its first group decays) or in order of first appearance."""
    for key in sorted(src.sd):
        if key[1] == 0:
            continue
        ps = src.params(key)
        opt = src.sd[key]["optimizer"]
        groups = (opt["optimizer"] if fp16 else opt)["param_groups"]
        if ps and _no_wd(*ps[0]) and len(groups) >= 2:
            return groups[0]["wd_mult"] != 0
    return False


def _target_optimizer(src, prim, prim_key, params, T, t, locs):
    """docs 'Optimizer (non-distributed)'."""
    outer_src = prim["optimizer"]
    fp16 = "fp32_from_fp16_params" in outer_src
    inner_src = outer_src["optimizer"] if fp16 else outer_src
    # Target groups: one per class, in order of the class's first parameter on this stage.
    order = []
    for name, w, *_ in params:
        c = _no_wd(name, w)
        if c not in order:
            order.append(c)
    uses_wd_mult = any("wd_mult" in g for g in inner_src["param_groups"])
    if uses_wd_mult and _sorted_groups(src, fp16):  # docs: weight-decay group first
        order = [c for c in (False, True) if c in order]
    if not uses_wd_mult:  # the source order of the classes
        src_order = [g["weight_decay"] == 0 for g in inner_src["param_groups"]]
        order = [c for c in dict.fromkeys(src_order) if c in order] + \
                [c for c in order if c not in src_order]

    def template(c):
        keys = [prim_key] + [(prim_key[0], sp) for sp in range(src.P)]
        for key in keys:
            opt = src.sd[key]["optimizer"]
            inner = opt["optimizer"] if fp16 else opt
            for g in inner["param_groups"]:
                nowd = g["wd_mult"] == 0 if "wd_mult" in g else g["weight_decay"] == 0
                if nowd == c:
                    return g
        raise ViewError("no optimizer group of a needed class")

    groups, state, masters = [], {}, []
    idx = 0
    for c in order:
        tmpl = template(c)
        members = [x for x in params if _no_wd(x[0], x[1]) == c]
        g = {}
        ids = list(range(idx, idx + len(members)))
        for k, v in tmpl.items():
            g[k] = ids if k == "params" else copy.deepcopy(v)
        groups.append(g)
        ms = []
        for i, (name, w, full, r0, rows) in zip(ids, members):
            first = full.shards[r0]
            src_state = first[2]
            loaded = src.loaded[(r0, full.p)]
            st = {}
            for k, v in src_state.items():
                if k in full.full:
                    st[k] = full.split(k, T, t, rows)
                    locs[id(st[k])] = full.locations[k]
                else:
                    st[k] = _pass(v, loaded, locs)
            state[i] = st
            if fp16:
                m = full.split("master", T, t, rows)
                locs[id(m)] = full.locations["master"]
                ms.append(m)
        masters.append(ms)
        idx += len(members)
    inner = {}
    for k, v in inner_src.items():
        inner[k] = state if k == "state" else groups if k == "param_groups" else \
            _pass(v, src.loaded[prim_key], locs)
    if not fp16:
        return inner
    outer = {}
    for k, v in outer_src.items():
        outer[k] = inner if k == "optimizer" else masters if k == "fp32_from_fp16_params" else \
            _pass(v, src.loaded[prim_key], locs)
    return outer


def write_reference(ref, out_root, dirname):
    """Saves a Reference as a checkpoint (for round trips), storages at their expected locations
    (the first allowed one), synthesized containers as the OrderedDict Megatron writes."""
    for (t, p), sd in ref.files.items():
        d = Path(out_root) / dirname / rank_name(t, p, ref.P)
        d.mkdir(parents=True, exist_ok=True)
        where = {}

        def visit(x):
            if isinstance(x, torch.Tensor):
                locs = sorted(l for l in ref.locations[(t, p)].get(id(x), ()) if l)
                if x.numel() and locs and locs[0] != "cpu":
                    where[x.storage().data_ptr()] = locs[0]
            elif isinstance(x, dict):
                for k, v in list(x.items()):
                    if isinstance(v, Loose):
                        x[k] = collections.OrderedDict(v)
                        x[k]._metadata = _module_metadata(v.keys())
                    visit(x[k])
            elif isinstance(x, (list, tuple)):
                for v in x:
                    visit(v)
        sd = dict(sd)
        visit(sd)
        with _LocationTagger(where):
            torch.save(sd, d / FILE)
    (Path(out_root) / TRACKER).write_bytes(ref.tracker)


# ------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------

def _bits(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def assert_same(got, want, path="root", got_loaded=None, want_locs=None, tensors_only=False):
    """Bitwise equality of a loaded view object with the reference: types, key order, dtypes,
    shapes, tensor bytes, requires_grad, Parameter wrapping, OrderedDict _metadata, and (when
    got_loaded and want_locs are given) each storage's recorded location."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)} is not a tensor"
        assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {list(got.shape)} != {list(want.shape)}"
        assert got.requires_grad == want.requires_grad, f"{path}: requires_grad"
        assert torch.equal(_bits(got), _bits(want)), f"{path}: values differ"
        if got_loaded is not None and want_locs is not None and id(want) in want_locs and \
                got.numel():
            loc = got_loaded.location(got)
            allowed = want_locs[id(want)]
            assert loc in allowed, f"{path}: storage location {loc}, expected one of {allowed}"
        return
    if tensors_only and not isinstance(want, (dict, list, tuple, argparse.Namespace)):
        return
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: {type(got)} is not a dict"
        if not tensors_only and not isinstance(want, Loose):
            assert type(got) is type(want), f"{path}: {type(got).__name__} != " \
                                            f"{type(want).__name__}"
            assert list(got.keys()) == list(want.keys()), \
                f"{path}: keys {list(got.keys())} != {list(want.keys())}"
            if not getattr(want, UNCHECKED, False):
                gm, wm = getattr(got, "_metadata", None), getattr(want, "_metadata", None)
                assert gm == wm, f"{path}._metadata: {gm} != {wm}"
        else:
            assert set(got.keys()) == set(want.keys()), f"{path}: keys differ"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}", got_loaded, want_locs, tensors_only)
        return
    if isinstance(want, argparse.Namespace):
        assert isinstance(got, argparse.Namespace), f"{path}: {type(got)}"
        assert_same(vars(got), vars(want), path, got_loaded, want_locs, tensors_only)
        return
    if isinstance(want, (list, tuple)):
        assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{path}[{i}]", got_loaded, want_locs, tensors_only)
        return
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and \
            np.array_equal(got, want), f"{path}: arrays differ"
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    assert got == want, f"{path}: {got!r} != {want!r}"


def compare_view(view_root, ref, dirname):
    """Loads every file of a view iteration directory and compares it with the reference."""
    d = Path(view_root) / dirname
    want_dirs = sorted(rank_name(t, p, ref.P) for (t, p) in ref.files)
    got_dirs = sorted(os.listdir(d))
    assert got_dirs == want_dirs, f"{d}: {got_dirs} != {want_dirs}"
    for (t, p), want in ref.files.items():
        f = rank_name(t, p, ref.P)
        path = d / f / FILE
        got = Loaded(path)
        assert_same(got.obj, want, f"{f}", got, ref.locations[(t, p)])
        sharing.assert_same_sharing(got.obj, want, f"{f}")


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def _config_from(ns):
    return ModelConfig(
        era=ns.era, num_layers=ns.layers, hidden_size=ns.hidden, num_attention_heads=ns.heads,
        num_query_groups=ns.groups, ffn_hidden_size=ns.ffn, swiglu=ns.swiglu, vocab_size=ns.vocab,
        make_vocab_size_divisible_by=ns.divisible, untie=ns.untie, bias=not ns.no_bias,
        normalization="RMSNorm" if ns.rmsnorm else "LayerNorm",
        position_embedding_type="rope" if ns.rope else "learned_absolute",
        args_vocab_size=not ns.no_args_vocab, extra_state=ns.extra_state, seed=ns.seed,
        distinct_steps=ns.marks, skew_replicas=ns.marks, skew_head=ns.marks, mystery=ns.mystery,
        cuda_locations=ns.cuda)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a source checkpoint")
    g.add_argument("root")
    g.add_argument("--tp", type=int, default=2)
    g.add_argument("--pp", type=int, default=1)
    g.add_argument("--iteration", type=int, default=100)
    g.add_argument("--era", choices=("mcore", "legacy"), default="mcore")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--hidden", type=int, default=64)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--groups", type=int, default=0, help="query groups (GQA); 0: none")
    g.add_argument("--ffn", type=int, default=128)
    g.add_argument("--swiglu", action="store_true")
    g.add_argument("--vocab", type=int, default=1000)
    g.add_argument("--divisible", type=int, default=96)
    g.add_argument("--untie", action="store_true")
    g.add_argument("--no-bias", action="store_true")
    g.add_argument("--rmsnorm", action="store_true")
    g.add_argument("--rope", action="store_true")
    g.add_argument("--no-args-vocab", action="store_true", help="args.vocab_size = None")
    g.add_argument("--extra-state", choices=("none", "empty"), default="none")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--marks", action="store_true",
                   help="distinct steps, skewed replicas and head copy (makes the rules visible)")
    g.add_argument("--mystery", action="store_true", help="add a parameter no rule covers")
    g.add_argument("--cuda", action="store_true", help="record cuda:N storage locations")
    r = sub.add_parser("reference", help="write the expected view of a source checkpoint")
    r.add_argument("root")
    r.add_argument("out")
    r.add_argument("--tp", type=int, required=True)
    r.add_argument("--pp", type=int, required=True)
    c = sub.add_parser("compare", help="compare ROOT/.views/tpT-ppP (or --view DIR) with the "
                                       "reference")
    c.add_argument("root")
    c.add_argument("--tp", type=int, required=True)
    c.add_argument("--pp", type=int, required=True)
    c.add_argument("--view")
    ns = ap.parse_args(argv)
    if ns.cmd == "generate":
        save_checkpoint(ns.root, _config_from(ns), ns.tp, ns.pp, ns.iteration)
        return 0
    dirname = iteration_dir_name(ns.root)
    try:
        ref = reference_shard(ns.root, ns.tp, ns.pp, dirname)
    except ViewError as e:
        print(f"invalid view: {e}", file=sys.stderr)
        return 1
    if ns.cmd == "reference":
        write_reference(ref, ns.out, dirname)
        return 0
    view = ns.view or os.path.join(ns.root, ".views", f"tp{ns.tp}-pp{ns.pp}")
    compare_view(view, ref, dirname)
    print(f"{view}: equal to the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
