#!/usr/bin/python3
"""DeepSpeed ZeRO stage 1/2 checkpoints for the data-parallel and universal view tests.

Three parts:

* The GENERATOR builds a small Megatron-DeepSpeed-like model (a deterministic function of a seed,
  independent of DP and TP) and writes it as DeepSpeed's engine does for DP=dp, TP=tp:
  ROOT/latest, ROOT/global_stepN/mp_rank_TT_model_states.pt and
  ROOT/global_stepN/[bf16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt.
* The REFERENCE knows nothing of the generator: from the source files alone it computes what
  ROOT/.views/dpD (`reference_dp`), ROOT/.views/universal (`reference_universal`) and
  ROOT/.views/tpT-dpD (`reference_tp`) must hold, object by object.
* COMPARE (`compare_dp`, `compare_universal`, `compare_tp`) holds a view directory against the
  reference (exact types, key order, pickled classes, tensor bits, recorded storage locations,
  zip CRCs) and then loads it as DeepSpeed would (rank files picked by dp_world_size,
  zero_to_fp32-style rebuild, universal slicing) against the model.

CLI (run with /usr/bin/python3, which has torch):
  deepspeed_fixture.py generate ROOT --dp 4 [--tp 2] [--step 10] [--dtype fp16] [--stage 1]
                       [--optimizer torch_adamw|sgd|fused_adam] [--amsgrad] [--uc-info] [--cuda]
                       [--seed S] [--py311-enum] [--megatron]
  deepspeed_fixture.py compare-dp ROOT --dp 2 [--view DIR]     (default ROOT/.views/dp2)
  deepspeed_fixture.py compare-universal ROOT [--view DIR]     (default ROOT/.views/universal)
  deepspeed_fixture.py compare-tp ROOT --tp 4 --dp 2 [--view DIR]  (default ROOT/.views/tp4-dp2)
  deepspeed_fixture.py reference-dp ROOT OUT --dp 2 | reference-universal ROOT OUT
                       | reference-tp ROOT OUT --tp 4 --dp 2

Facts taken from DeepSpeed's own code (deepspeedai/DeepSpeed 0.16.5 and 0.19.6; read, not copied):
  [ENGINE] runtime/engine.py: save_checkpoint (tag "global_step{N}"; `latest` = the tag, no
           newline, written last; zero_to_fp32.py copied into the save dir); _save_checkpoint /
           _common_checkpoint_state (model-states keys and order, 0.16.5: no
           checkpoint_parallel_dimensions; optimizer None under ZeRO; frozen_param_shapes /
           frozen_param_fragments (param.detach().cpu()) only at stage 2; client_state last);
           module_state_dict; _get_zero_param_shapes (per group OrderedDict name -> torch.Size in
           flat order); _get_shared_params; _get_ckpt_name, _get_zero_ckpt_prefix,
           _get_rank_zero_ckpt_name (bf16_ prefix whenever bf16 is on); _save_zero_checkpoint
           ({optimizer_state_dict, ds_config, ds_version}); _get_all_zero_checkpoint_names (the
           model file's dp_world_size picks the files; each rank reads its own).
  [ZERO]   runtime/zero/stage_1_and_2.py: __init__ (alignment 2*dp, one padded flat 16-bit buffer
           per group whose views are the model's params, fp32 partition cloned from it, tail-rank
           padding), state_dict (key order; rigid base_optimizer_state with full-partition state
           tensors; fp32 partitions saved as [:numel - padding] views), _create_param_mapping,
           _load_legacy_checkpoint. runtime/utils.py align_dense_tensors.
  [BF16]   runtime/bf16_optimizer.py BF16_Optimizer (chosen by the engine for bf16 with ZeRO
           stage 1 and data_types.grad_accum_dtype fp32): the same flat buffer per group,
           aligned to 2*dp and cut into dp partitions, and the fp32 partition a clone of the
           rank's whole partition; state_dict keys clip_grad, base_optimizer_state,
           single_partition_of_fp32_groups (the partitions whole, padding included),
           group_paddings (aligned - numel on the last rank, 0 elsewhere), partition_count,
           ds_version, param_slice_mappings; no zero_stage, no loss scaler.
           _load_legacy_checkpoint takes its own rank's file whole (fp32 padded to the
           partition size).
  [FRAG]   utils/tensor_fragment.py fragment_address (@dataclass numel, start) and
           get_hp_fragment_mapping (start inside the partition); utils/mixed_precision_linkage.py.
  [SCALER] runtime/fp16/loss_scaler.py CreateLossScaler (bf16: LossScaler(1.0); fp16:
           DynamicLossScaler), __dict__ order of both; runtime/zero/config.py ZeroStageEnum(int,
           Enum), pickled as (cls, (value,)) by Python 3.10 and 3.12+, getattr(cls, name) by 3.11.
  [ADAM]   ops/adam/fused_adam.py: defaults lr, bias_correction, betas, eps, weight_decay; group
           'step' 0 added at the first step; per-param state step (int), exp_avg, exp_avg_sq.
           torch 1.13's AdamW (0-dim float step) and SGD. JSON config lists stay lists.
  [UNIV]   checkpoint/ds_to_universal.py: extract_zero_shards (fragments by param_slice_mappings),
           _merge_zero_shards / merge_tp_slices (dp fragments concatenated, reshaped to each TP
           rank's shape; replicated, row (cat_dim 1) and default (cat_dim 0) branches, vocabulary
           cut to original_vocab_size with vocab_tensor; step.pt raw), _save_optimizer_state,
           --inject_missing_state, model files copied, latest_universal.
           checkpoint/zero_checkpoint.py (torch.load to cpu, paddings stripped, group_paddings
           [0]*n, partition_count [dp]*n). checkpoint/universal_checkpoint.py
           load_hp_checkpoint_state (vocab rows zero-padded, chunk on cat_dim).
           utils/zero_to_fp32.py (stripped partitions concatenated, walked with param_shapes).
  [PIPE]   runtime/pipe/module.py: ckpt_layer_path (layer_{idx:02d}[-{rank_repr}]-model_states.pt,
           no data-parallel axis in rank_repr), save_state_dict (data_parallel_id 0 only);
           runtime/pipe/engine.py module_state_dict (the layers go to those files, `module` None).
  [MDS]    Megatron-DeepSpeed megatron/model/gpt_model.py UniversalCheckpointInfo:
           vocabulary_parameter_patterns always; tp_replicated_parameter_patterns (norms,
           position embeddings, biases of row-parallel layers) and
           parameter_with_row_parallelism_patterns only when tensor_model_parallel_size > 1;
           never parameter_to_average_patterns (which ds_to_universal still reads).
           checkpoint/universal_checkpoint.py load_hp_checkpoint_state also takes a universal
           tensor whole when its shape is the target parameter's.
  The views' contract generalises ds_to_universal (which hard-codes exp_avg/exp_avg_sq): one
  <key>.pt per tensor state key the checkpoint holds, e.g. SGD's momentum_buffer.
"""
import argparse
import collections
import enum
import math
import os
import re
import sys
import types
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

import sharing

DS_VERSION = "0.16.5"
UC_VERSION = 0.2            # UNIVERSAL_CHECKPOINT_VERSION_VALUE of 0.16.5
BASE, SINGLE = "base_optimizer_state", "single_partition_of_fp32_groups"
PSM = "param_slice_mappings"

# ------------------------------------------------------------------------------------------------
# DeepSpeed's pickled classes, without DeepSpeed: stand-in modules under the real names
# ------------------------------------------------------------------------------------------------


def _stand_in(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[n])
    return sys.modules[name]


try:  # the real classes when DeepSpeed is installed
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
except ImportError:
    _LS, _ZC, _TF = (_stand_in("deepspeed.runtime.fp16.loss_scaler"),
                     _stand_in("deepspeed.runtime.zero.config"),
                     _stand_in("deepspeed.utils.tensor_fragment"))

    class LossScalerBase:
        __module__ = _LS.__name__

    class LossScaler(LossScalerBase):
        __module__ = _LS.__name__

    class DynamicLossScaler(LossScalerBase):
        __module__ = _LS.__name__

    class ZeroStageEnum(int, enum.Enum):
        __module__ = _ZC.__name__
        disabled = 0
        optimizer_states = 1
        gradients = 2
        weights = 3
        max_stage = 3

    @dataclass
    class fragment_address:  # noqa: N801 - DeepSpeed's name
        __module__ = _TF.__name__
        numel: int
        start: int

    _LS.LossScalerBase, _LS.LossScaler, _LS.DynamicLossScaler = \
        LossScalerBase, LossScaler, DynamicLossScaler
    _ZC.ZeroStageEnum = ZeroStageEnum
    _TF.fragment_address = fragment_address


try:  # universal_checkpoint_info's parameter_with_sub_params entries, as the universal files keep them
    from deepspeed.checkpoint.universal_checkpoint import SubparamShape
except ImportError:
    _UC = _stand_in("deepspeed.checkpoint.universal_checkpoint")

    @dataclass
    class SubparamShape:
        __module__ = _UC.__name__
        patterns: list
        shape: tuple
        partition_dim: int

    _UC.SubparamShape = SubparamShape


def _obj(cls, **attrs):
    """An instance with exactly this __dict__ (in this order), as __init__ would leave it."""
    o = cls.__new__(cls)
    o.__dict__.update(attrs)
    return o


# ------------------------------------------------------------------------------------------------
# Partitioning facts [ZERO] [UTILS]
# ------------------------------------------------------------------------------------------------

def aligned_numel(total, dp):
    a = 2 * dp
    return total if total % a == 0 else total + a - total % a


def partition_size(total, dp):
    return aligned_numel(total, dp) // dp


def rank_padding(total, dp, r):
    ps = partition_size(total, dp)
    left = r * ps
    if total <= left:
        return ps
    if total < left + ps:
        return left + ps - total
    return 0


def slice_mappings(named_numels, total, dp, r):
    """OrderedDict name -> fragment_address(numel overlap, start inside rank r's partition)."""
    ps = partition_size(total, dp)
    lo, hi = r * ps, (r + 1) * ps
    out, off = collections.OrderedDict(), 0
    for name, n in named_numels:
        if off < hi and off + n > lo:
            s, e = max(off, lo), min(off + n, hi)
            out[name] = fragment_address(start=s - lo, numel=e - s)
        off += n
    return out


def _numel(shape):
    return int(math.prod(shape))


# ------------------------------------------------------------------------------------------------
# Generator: the model
# ------------------------------------------------------------------------------------------------

ORIG_VOCAB, PADDED_VOCAB = 13, 16
_L = "language_model.encoder.layers.0."
# name, full shape, TP split (vocab: rows; col: dim 0; row: dim 1; rep: replicated), optimizer
# group (0 weight decay, 1 no decay, None frozen). Group numels per TP rank: tp1 235 / 17,
# tp2 135 / 11: odd, so padded at every DP; 17 at DP 4 and 11 at DP 4 leave rank 3 all padding.
PARAMS = (
    ("language_model.embedding.word_embeddings.weight", (PADDED_VOCAB, 5), "vocab", 0),
    ("language_model.embedding.position_embeddings.weight", (7, 5), "rep", 0),
    ("language_model.embedding.tokentype_embeddings.weight", (2, 5), "rep", None),
    (_L + "input_layernorm.weight", (5,), "rep", 1),
    (_L + "self_attention.query_key_value.weight", (12, 5), "col", 0),
    (_L + "self_attention.query_key_value.bias", (12,), "col", 1),
    (_L + "self_attention.dense.weight", (5, 12), "row", 0),
)
BUFFERS = ((_L + "self_attention.inv_freq", (3,), True),      # persistent: saved, buffer_names
           (_L + "self_attention.causal_mask", (2, 2), False))  # not saved
SPLIT = {n: s for n, _, s, _ in PARAMS}
UC_PATTERNS = {
    "tp_replicated_parameter_patterns": [r"language_model\.embedding\.position_embeddings\.weight",
                                         r"language_model\.encoder\.layers\.\d+\.input_layernorm"],
    "parameter_with_row_parallelism_patterns": [
        r"language_model\.encoder\.layers\.\d+\.self_attention\.dense\.weight"],
    "vocabulary_parameter_patterns": [r"language_model\.embedding\.word_embeddings\.weight"],
}
TP_SIZES = (1, 2, 4)


def split(full, rule, tp, t):
    if tp == 1 or rule == "rep":
        return full
    return full.chunk(tp, 1 if rule == "row" else 0)[t].contiguous()


@dataclass
class Options:
    dp: int = 4
    tp: int = 1
    step: int = 10
    dtype: str = "bf16"          # or "fp16"
    stage: int = 2               # 1 or 2
    optimizer: str = "fused_adam"  # "torch_adamw", "sgd"
    amsgrad: bool = False        # torch_adamw only: max_exp_avg_sq
    seed: int = 1234
    cuda: bool = False           # storages recorded as cuda:0 (as a save from GPU memory)
    uc_info: bool = None         # Megatron-DeepSpeed's universal_checkpoint_info (default tp > 1)
    enum_by_value: bool = True   # ZeroStageEnum pickled as Python 3.10/3.12+ do (cls, (2,));
                                 # False: as 3.11 does, getattr(cls, 'gradients')
    megatron: bool = False       # Megatron-DeepSpeed's `args` (make_vocab_size_divisible_by 4:
                                 # padded 16 at TP 1, 2, 4) and zero vocabulary padding rows
                                 # (as after a universal load)
    average: bool = False        # the replicated parameters listed in
                                 # parameter_to_average_patterns instead (which ds_to_universal
                                 # averages), each TP rank's copy a little different
    tp_lists: bool = None        # tp_replicated_parameter_patterns and
                                 # parameter_with_row_parallelism_patterns in uc_info; default
                                 # tp > 1, as Megatron-DeepSpeed writes them [MDS]
    bf16_optimizer: bool = False  # bf16, ZeRO stage 1 and fp32 gradient accumulation: the
                                  # engine's BF16_Optimizer writes the optimizer files [BF16]

    def __post_init__(self):
        if self.uc_info is None:
            self.uc_info = self.tp > 1
        if self.tp_lists is None:
            self.tp_lists = self.tp > 1
        assert 1 <= self.dp and self.tp in TP_SIZES and self.stage in (1, 2)
        assert self.dtype in ("bf16", "fp16") and self.optimizer in ("fused_adam", "torch_adamw",
                                                                       "sgd")
        assert not self.bf16_optimizer or (self.dtype == "bf16" and self.stage == 1)

    @property
    def torch_dtype(self):
        return torch.bfloat16 if self.dtype == "bf16" else torch.float16

    @property
    def skipped(self):  # fp16 overflow steps
        return 2 if self.dtype == "fp16" else 0

    def state_kinds(self):
        if self.optimizer == "sgd":
            return ["momentum_buffer"]
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if self.optimizer == "torch_adamw"
                                             and self.amsgrad else [])

    def step_value(self):
        """The per-parameter 'step' state, as the optimizer holds it; None for SGD."""
        n = self.step - self.skipped
        return {"fused_adam": n, "torch_adamw": torch.tensor(float(n))}.get(self.optimizer)

    def lr(self):
        return 3e-4 * math.log(self.step + 1) / math.log(100)


class FullModel:
    """Every tensor of the unsharded model, a function of the seed alone (per name and kind:
    master (fp32; the 16-bit weight is its rounding), exp_avg, exp_avg_sq, max_exp_avg_sq,
    momentum_buffer, buffer)."""

    def __init__(self, seed, zero_vocab_pad=False, averaged=False):
        self.seed, self._cache, self.zero_pad = seed, {}, zero_vocab_pad
        self.averaged = averaged  # replicated parameters differ per TP rank (see local)

    def full(self, name, kind):
        key = (name, kind)
        if key not in self._cache:
            shape = dict((n, s) for n, s, _, _ in PARAMS).get(name) or \
                dict((n, s) for n, s, _ in BUFFERS)[name]
            g = torch.Generator()
            g.manual_seed(zlib.crc32(f"{self.seed}/{name}/{kind}".encode()))
            if kind == "exp_avg_sq":
                t = torch.rand(shape, generator=g) * 1e-5
            elif kind == "max_exp_avg_sq":
                t = self.full(name, "exp_avg_sq") + torch.rand(shape, generator=g) * 1e-6
            else:
                t = torch.randn(shape, generator=g) * {"master": 0.05, "exp_avg": 1e-3,
                                                       "momentum_buffer": 1e-2, "buffer": 1.0}[kind]
            if self.zero_pad and SPLIT.get(name) == "vocab":
                t[ORIG_VOCAB:] = 0
            self._cache[key] = t
        return self._cache[key]

    def local(self, name, kind, tp, t):
        x = split(self.full(name, kind), SPLIT[name], tp, t)
        if self.averaged and SPLIT[name] == "rep":
            # Rank t's copy: scaled by up to 1 + 0.001 (t + 1) (signs kept), element 0 -0.0.
            g = torch.Generator()
            g.manual_seed(zlib.crc32(f"{self.seed}/{name}/{kind}/{tp}/{t}".encode()))
            x = x * (1 + 1e-3 * (t + 1) * torch.rand(x.shape, generator=g))
            x.view(-1)[0] = -0.0
        return x


def group_params(tp, t):
    """Per optimizer group [(name, local shape)] on TP rank t, in flat-buffer order."""
    out = [[], []]
    for name, shape, rule, g in PARAMS:
        if g is not None:
            out[g].append((name, tuple(split(torch.empty(shape), rule, tp, t).shape)))
    return out


class _FusedAdam(torch.optim.Optimizer):
    """deepspeed.ops.adam.FusedAdam's param groups and state_dict (torch's packing) [ADAM]."""

    def __init__(self, params, lr, bias_correction, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                      weight_decay=weight_decay))


def make_optimizer(o, parts):
    # The client's groups (Megatron-style): no-decay group sets weight_decay itself. parts: each
    # group's flat partition, or (ZeRO-3) the list of its sub-groups' partitions.
    params = [p if isinstance(p, list) else [p] for p in parts]
    groups = [{"params": params[0]}, {"params": params[1], "weight_decay": 0.0}]
    if o.optimizer == "fused_adam":
        opt = _FusedAdam(groups, lr=3e-4, bias_correction=True, betas=[0.9, 0.999], eps=1e-8,
                         weight_decay=0.01)
        for g in opt.param_groups:
            g["step"] = 0
    elif o.optimizer == "torch_adamw":
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
                                amsgrad=o.amsgrad)
    else:
        opt = torch.optim.SGD(groups, lr=3e-4, momentum=0.9, weight_decay=0.01)
    for g in opt.param_groups:
        g["lr"] = o.lr()  # the engine's lr scheduler
    return opt


def loss_scaler(o):
    if o.dtype == "bf16":
        return _obj(LossScaler, cur_scale=1.0, dynamic=False)
    return _obj(DynamicLossScaler, cur_scale=16384.0, dynamic=True, cur_iter=o.step,
                last_overflow_iter=o.step - 3, scale_factor=2.0, scale_window=1000, min_scale=1,
                delayed_shift=2, cur_hysteresis=2, consecutive_hysteresis=False,
                raise_error_at_min_scale=True, dtype=torch.float16)


def ds_config(o):
    c = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
         "steps_per_print": 10, "gradient_clipping": 1.0}
    p = {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
    if o.optimizer == "fused_adam":
        c["optimizer"] = {"type": "Adam", "params": p}
    elif o.optimizer == "torch_adamw":
        c["optimizer"] = {"type": "AdamW", "params": {**p, "torch_adam": True,
                                                      "amsgrad": o.amsgrad}}
    else:
        c["zero_allow_untested_optimizer"] = True
    c["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                     "warmup_num_steps": 100}}
    if o.dtype == "bf16":
        c["bf16"] = {"enabled": True}
    else:
        c["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                     "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    c["zero_optimization"] = {"stage": o.stage, "overlap_comm": True,
                              "contiguous_gradients": True, "reduce_bucket_size": 500000000}
    if o.bf16_optimizer:  # [BF16] what makes the engine pick BF16_Optimizer over ZeRO stage 1
        c["data_types"] = {"grad_accum_dtype": "fp32"}
    return c


def uc_info(o):
    patterns = dict(UC_PATTERNS)
    if not o.tp_lists:
        del patterns["tp_replicated_parameter_patterns"]
        del patterns["parameter_with_row_parallelism_patterns"]
    if o.average:
        patterns["parameter_to_average_patterns"] = patterns.pop(
            "tp_replicated_parameter_patterns", UC_PATTERNS["tp_replicated_parameter_patterns"])
    return {"universal_checkpoint_version": UC_VERSION, "original_vocab_size": ORIG_VOCAB,
            "padded_vocab_size": PADDED_VOCAB, **patterns}


def _module(entries):
    """A torch module tree holding the given (name, tensor, kind) entries."""
    root = torch.nn.Module()
    for name, value, kind in entries:
        *path, leaf = name.split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        if kind in ("param", "frozen"):
            m.register_parameter(leaf, torch.nn.Parameter(value, requires_grad=kind == "param"))
        else:
            m.register_buffer(leaf, value, persistent=kind == "buffer")
    return root


class _LocationTagger:
    """Makes torch.save record 'cuda:0' (or any location) for the storages at the given data
    pointers, as a save from GPU memory does, without a GPU."""

    def __init__(self, where):
        self.where = where

    def __enter__(self):
        import torch.serialization as ser
        self.entry = (1, lambda obj: self.where.get(obj.data_ptr()), lambda obj, loc: None)
        ser._package_registry.append(self.entry)
        ser._package_registry.sort(key=lambda e: e[0])

    def __exit__(self, *exc):
        import torch.serialization as ser
        ser._package_registry.remove(self.entry)


def _save(obj, path, gpu_tensors=()):
    where = {t.storage().data_ptr(): "cuda:0" for t in gpu_tensors if t.storage().nbytes()}
    with _LocationTagger(where):
        torch.save(obj, path)


def optim_name(o_or_bf16, d, tt):
    bf16 = o_or_bf16 if isinstance(o_or_bf16, bool) else o_or_bf16.dtype == "bf16"
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{d}_mp_rank_{tt:02d}_optim_states.pt"


def model_name(tt):
    return f"mp_rank_{tt:02d}_model_states.pt"


def _write_tp_rank(o, model, tdir, tt, cfg):
    dt, groups = o.torch_dtype, group_params(o.tp, tt)
    totals = [sum(_numel(s) for _, s in g) for g in groups]

    def flat(g, kind, dtype):
        parts = [model.local(n, kind, o.tp, tt).to(dtype).reshape(-1) for n, _ in groups[g]]
        return torch.cat(parts + [torch.zeros(aligned_numel(totals[g], o.dp) - totals[g],
                                              dtype=dtype)])
    # model states [ENGINE]: params are views of one padded flat 16-bit buffer per group
    flats16 = [flat(g, "master", dt) for g in range(2)]
    views, entries = {}, []
    for g in range(2):
        off = 0
        for n, s in groups[g]:
            views[n] = flats16[g][off:off + _numel(s)].view(s)
            off += _numel(s)
    for name, _, _, g in PARAMS:
        entries.append((name, views[name] if g is not None else
                        model.local(name, "master", o.tp, tt).to(dt), "param" if g is not None
                        else "frozen"))
    for name, _, persistent in BUFFERS:
        entries.append((name, model.full(name, "buffer").to(dt),
                        "buffer" if persistent else "buffer_np"))
    module = _module(entries)
    sd = module.state_dict()
    frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    stage2 = o.stage == 2
    OD = collections.OrderedDict
    ms = dict(
        module=sd, buffer_names=[n for n, _, persistent in BUFFERS if persistent], optimizer=None,
        param_shapes=[OD((n, torch.Size(s)) for n, s in g) for g in groups],
        frozen_param_shapes=OD((n, p.shape) for n, p in frozen) if stage2 else None,
        shared_params={},
        frozen_param_fragments=OD((n, p.detach().clone() if o.cuda else p.detach())
                                  for n, p in frozen) if stage2 else None,
        lr_scheduler={"last_batch_iteration": o.step - 1}, data_sampler=None, random_ltd=None,
        sparse_tensor_module_names=set(), skipped_steps=o.skipped, global_steps=o.step,
        global_samples=o.step * 64, dp_world_size=o.dp, mp_world_size=o.tp, ds_config=cfg,
        ds_version=DS_VERSION)
    ms["iteration"] = o.step  # client_state
    if o.megatron:
        ms["args"] = argparse.Namespace(num_layers=1, hidden_size=5,
                                        tensor_model_parallel_size=o.tp,
                                        make_vocab_size_divisible_by=4,
                                        padded_vocab_size=PADDED_VOCAB)
    if o.uc_info:
        ms["universal_checkpoint_info"] = uc_info(o)
    _save(ms, tdir / model_name(tt), list(sd.values()) if o.cuda else ())

    # optimizer states [ZERO]
    flats32 = [flat(g, "master", torch.float32) for g in range(2)]
    states = [{k: flat(g, k, torch.float32) for k in o.state_kinds()} for g in range(2)]
    named = [[(n, _numel(s)) for n, s in g] for g in groups]
    scaler = loss_scaler(o)
    for d in range(o.dp):
        ps = [partition_size(totals[g], o.dp) for g in range(2)]
        pads = [rank_padding(totals[g], o.dp, d) for g in range(2)]
        parts = [flats32[g][d * ps[g]:(d + 1) * ps[g]].clone() for g in range(2)]
        opt = make_optimizer(o, parts)
        gpu = list(parts)
        for g in range(2):
            st = {}
            if o.step_value() is not None:
                st["step"] = o.step_value()
            for k in o.state_kinds():
                st[k] = states[g][k][d * ps[g]:(d + 1) * ps[g]].clone()
                gpu.append(st[k])
            opt.state[parts[g]] = st
        if o.bf16_optimizer:
            # [BF16] state_dict: the fp32 partitions whole, padding (zeros) included; the whole
            # padding recorded on the last rank only.
            osd = {"clip_grad": cfg["gradient_clipping"], BASE: opt.state_dict(),
                   SINGLE: parts,
                   "group_paddings": [aligned_numel(totals[g], o.dp) - totals[g]
                                      if d == o.dp - 1 else 0 for g in range(2)],
                   "partition_count": [o.dp, o.dp], "ds_version": DS_VERSION,
                   PSM: [slice_mappings(named[g], totals[g], o.dp, d) for g in range(2)]}
            _save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION},
                  tdir / optim_name(o, d, tt), gpu if o.cuda else ())
            continue
        osd = {"loss_scaler": scaler, "dynamic_loss_scale": scaler.dynamic, "overflow": False,
               "clip_grad": cfg["gradient_clipping"], BASE: opt.state_dict(),
               SINGLE: [parts[g][:parts[g].numel() - pads[g]] for g in range(2)],
               "zero_stage": ZeroStageEnum.gradients if stage2 else
               ZeroStageEnum.optimizer_states,
               "group_paddings": pads, "partition_count": [o.dp, o.dp], "ds_version": DS_VERSION,
               PSM: [slice_mappings(named[g], totals[g], o.dp, d) for g in range(2)]}
        _save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION},
              tdir / optim_name(o, d, tt), gpu if o.cuda else ())


@dataclass
class Generated:
    root: Path
    tag: str
    options: Options
    model: FullModel

    def local(self, name, kind, t):
        return self.model.local(name, kind, self.options.tp, t)

    def universal(self):
        """The universal tree computed from the model itself (not from the files):
        {relative path: bytes or object}."""
        o, tag = self.options, self.tag
        out = Expected(tag=tag)
        out["latest_universal"] = tag.encode()
        for tt in range(o.tp):
            out[f"{tag}/{model_name(tt)}"] = (self.root / tag / model_name(tt)).read_bytes()
        out[f"{tag}/zero/optimizer_state.pt"] = dict(
            loss_scaler=loss_scaler(o), dynamic_loss_scale=o.dtype == "fp16", overflow=False,
            clip_grad=1.0, zero_stage=ZeroStageEnum(o.stage), group_paddings=[0, 0],
            partition_count=[o.dp, o.dp], ds_version=DS_VERSION,
            param_groups=make_optimizer(o, [torch.zeros(2), torch.zeros(2)]).state_dict()[
                "param_groups"])
        for name, _, rule, g in PARAMS:
            if g is None:
                continue
            for kind in ["master"] + o.state_kinds():
                full = self.model.full(name, kind)
                if o.uc_info and o.average and rule == "rep":
                    d = {"param": sum(self.local(name, kind, t) for t in range(o.tp)) / o.tp}
                elif not o.uc_info or (rule in ("rep", "row") and not o.tp_lists):
                    d = {"cat_dim": 0, "param": full}
                elif rule == "rep":
                    d = {"param": full}
                elif rule == "vocab":
                    d = {"cat_dim": 0, "vocab_tensor": True, "param": full[:ORIG_VOCAB]}
                else:
                    d = {"cat_dim": 1 if rule == "row" else 0, "param": full}
                out[f"{tag}/zero/{name}/{'fp32' if kind == 'master' else kind}.pt"] = d
            if o.step_value() is not None:
                out[f"{tag}/zero/{name}/step.pt"] = o.step_value()
        return out


def write_recovery_script(root):
    """[ENGINE] _copy_recovery_script: zero_to_fp32.py in the checkpoint root (a placeholder)."""
    script = Path(root) / "zero_to_fp32.py"
    script.write_text("#!/usr/bin/env python\n# stands for DeepSpeed's utils/zero_to_fp32.py\n")
    os.chmod(script, 0o755)


def generate(root, dp=4, tp=1, step=10, dtype="bf16", stage=2, optimizer="fused_adam",
             amsgrad=False, seed=1234, cuda=False, uc_info=None, enum_by_value=True,
             megatron=False, average=False, tp_lists=None, bf16_optimizer=False):
    """Writes ROOT/global_step{step}/... and then ROOT/latest; returns a Generated (the model)."""
    o = Options(dp, tp, step, dtype, stage, optimizer, amsgrad, seed, cuda, uc_info, enum_by_value,
                megatron, average, tp_lists, bf16_optimizer)
    root, tag, cfg = Path(root), f"global_step{step}", ds_config(o)
    model = FullModel(seed, megatron, average)
    (root / tag).mkdir(parents=True, exist_ok=True)
    had = ZeroStageEnum.__dict__.get("__reduce_ex__")
    ZeroStageEnum.__reduce_ex__ = (lambda self, proto: (type(self), (self._value_,))) \
        if enum_by_value else (lambda self, proto: (getattr, (type(self), self._name_)))
    try:
        for tt in range(tp):
            _write_tp_rank(o, model, root / tag, tt, cfg)
    finally:
        if had is None:
            del ZeroStageEnum.__reduce_ex__
        else:
            ZeroStageEnum.__reduce_ex__ = had
    write_recovery_script(root)
    with open(root / "latest", "w") as f:
        f.write(tag)
    return Generated(root, tag, o, model)


# ------------------------------------------------------------------------------------------------
# Reading the source, with storage locations
# ------------------------------------------------------------------------------------------------

class ViewError(ValueError):
    """The source cannot be viewed (the view must fail with EINVAL, naming this)."""


class Loaded:
    """A torch.load result and the location each tensor's storage was saved with."""

    def __init__(self, path):
        seen = {}

        def record(storage, location):
            if storage.nbytes():
                seen[storage.data_ptr()] = location
            return storage
        with open(path, "rb") as f:
            self.obj = torch.load(f, map_location=record)
        self.seen = seen

    def location(self, t):
        s = t.storage()
        return self.seen.get(s.data_ptr()) if s.nbytes() else None


class Source:
    """ROOT's latest tag: model-states and optimizer files per TP rank."""

    def __init__(self, root):
        self.root = Path(root)
        self.latest = (self.root / "latest").read_bytes()
        self.tag = self.latest.decode().strip()
        d = self.root / self.tag
        if not d.is_dir():
            raise ViewError(f"latest names {self.tag!r}, which is not a directory")
        names = os.listdir(d)
        mp = sorted(n for n in names if re.fullmatch(r"mp_rank_\d\d_model_states\.pt", n))
        if not mp or mp != [model_name(t) for t in range(len(mp))]:
            raise ViewError(f"{self.tag}: model-states files {mp}")
        self.tp = len(mp)
        self.models = [Loaded(d / n) for n in mp]
        self.dp = self.models[0].obj["dp_world_size"]
        self.bf16 = any(n.startswith("bf16_zero_pp_rank_") for n in names)
        self.optim = []
        for tt in range(self.tp):
            row = []
            for r in range(self.dp):
                n = optim_name(self.bf16, r, tt)
                if n not in names:
                    raise ViewError(f"{self.tag}/{n} is missing")
                row.append(Loaded(d / n))
            self.optim.append(row)

    def osd(self, tt, r):
        return self.optim[tt][r].obj["optimizer_state_dict"]

    def shapes(self, tt):
        return self.models[tt].obj["param_shapes"]

    def merged(self, tt, g, key):
        """Group g's whole unpadded flat tensor of `key` ('fp32' or a state key): the source
        ranks' partitions with their group_paddings stripped, concatenated."""
        parts = []
        total = sum(_numel(s) for s in self.shapes(tt)[g].values())
        bf16_opt = is_bf16_optimizer(self.osd(tt, 0))
        for r in range(self.dp):
            sd = self.osd(tt, r)
            v = sd[SINGLE][g] if key == "fp32" else sd[BASE]["state"][g][key]
            if bf16_opt or key == "fp32":  # [BF16]: whole partitions, padding at the end
                parts.append(v)
            else:
                parts.append(v[:v.numel() - sd["group_paddings"][g]])
        out = torch.cat(parts)
        if bf16_opt:
            if out.numel() != aligned_numel(total, self.dp):
                raise ViewError(f"{self.tag} mp_rank {tt:02d} group {g}: {key} holds "
                                f"{out.numel()} elements, not {total} aligned to 2 x dp")
            out = out[:total]
        if out.numel() != total:
            raise ViewError(f"{self.tag} mp_rank {tt:02d} group {g}: {key} holds {out.numel()} "
                            f"elements, param_shapes {total}")
        return out


    def local(self, tt, name, key):
        """Parameter `name`'s tensor of `key` on TP rank tt (from the merged partitions)."""
        for g, shapes in enumerate(self.shapes(tt)):
            off = 0
            for n, s in shapes.items():
                if n == name:
                    return self.merged(tt, g, key).narrow(0, off, _numel(s)).view(s)
                off += _numel(s)
        raise KeyError(name)


def _is_sharded(v):
    return isinstance(v, torch.Tensor) and v.dim() > 0


def is_bf16_optimizer(sd):
    """Whether an optimizer_state_dict is BF16_Optimizer's [BF16]: ZeRO 1/2 always records its
    loss scaler (and zero_stage), BF16_Optimizer neither."""
    return "zero_stage" not in sd and "loss_scaler" not in sd


# ------------------------------------------------------------------------------------------------
# Reference
# ------------------------------------------------------------------------------------------------

class Expected(dict):
    """{path relative to the view directory: bytes (exact file) or object (torch.load result)};
    `locations` maps id() of expected tensors to the storage location they must be saved with
    (absent: 'cpu')."""

    def __init__(self, tag):
        super().__init__()
        self.tag, self.locations = tag, {}


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (dict, list, tuple)):
        for v in (x.values() if isinstance(x, dict) else x):
            yield from _tensors(v)


def _keep_locations(out, obj, loaded):
    for t in _tensors(obj):
        if loaded.location(t):
            out.locations[id(t)] = loaded.location(t)


def root_files(out, root):
    """[ENGINE] The dpD and tpT-dpD views carry the root's zero_to_fp32.py as it is."""
    p = Path(root) / "zero_to_fp32.py"
    if p.is_file():
        out["zero_to_fp32.py"] = p.read_bytes()


def reference_dp(root, D):
    """What ROOT/.views/dpD must hold: DeepSpeed's files had it trained at data-parallel size D."""
    src = Source(root)
    out = Expected(src.tag)
    out["latest"] = src.latest
    root_files(out, src.root)
    # A pipeline module's layer files: written by dp rank 0, named without the dp rank [PIPE].
    for n in os.listdir(src.root / src.tag):
        if re.fullmatch(r"layer_\d+(-model_\d+)?-model_states\.pt", n):
            out[f"{src.tag}/{n}"] = (src.root / src.tag / n).read_bytes()
    for tt in range(src.tp):
        ms = src.models[tt].obj
        ms["dp_world_size"] = D
        out[f"{src.tag}/{model_name(tt)}"] = ms
        _keep_locations(out, ms, src.models[tt])
        st0 = src.osd(tt, 0)[BASE]["state"]
        full = [{k: src.merged(tt, g, k) for k in ["fp32"] + [k for k, v in st0[g].items()
                                                               if _is_sharded(v)]}
                for g in range(len(src.shapes(tt)))]
        _optim_files(out, src, src.optim[tt][0], src.shapes(tt), full, D, tt)
    return out


def _optim_files(out, src, l0, groups, full, D, tt):
    """TP rank tt's D optimizer files: dp-0 file l0's, the partitioned entries cut for D from
    full[g] ({'fp32' or state key: group g's unpadded flat tensor}); groups: the param_shapes."""
    sd0 = l0.obj["optimizer_state_dict"]
    totals = [sum(_numel(s) for s in g.values()) for g in groups]
    named = [[(n, _numel(s)) for n, s in g.items()] for g in groups]
    where = [{k: l0.location(sd0[SINGLE][g] if k == "fp32" else sd0[BASE]["state"][g][k])
              for k in full[g]} for g in range(len(groups))]
    for d in range(D):
        parts = []
        for g, total in enumerate(totals):
            ps, al = partition_size(total, D), aligned_numel(total, D)
            p = {}
            for k, v in full[g].items():
                padded = torch.cat([v, torch.zeros(al - total, dtype=v.dtype)])
                p[k] = padded[d * ps:(d + 1) * ps].clone()
                if where[g][k]:
                    out.locations[id(p[k])] = where[g][k]
            parts.append(p)
        pads = [rank_padding(t, D, d) for t in totals]
        bf16_opt = is_bf16_optimizer(sd0)
        osd = {}
        for k, v in sd0.items():
            if k == BASE:
                v = {kk: vv for kk, vv in v.items()}
                v["state"] = {g: {kk: parts[g][kk] if kk in parts[g] else vv
                                  for kk, vv in st.items()} for g, st in v["state"].items()}
            elif k == SINGLE:
                v = [parts[g]["fp32"] if bf16_opt else
                     parts[g]["fp32"][:parts[g]["fp32"].numel() - pads[g]]
                     for g in range(len(groups))]
                for g, x in enumerate(v):
                    if where[g]["fp32"]:
                        out.locations[id(x)] = where[g]["fp32"]
            elif k == "group_paddings":
                v = pads if not bf16_opt else [  # [BF16] the whole padding, on the last rank
                    aligned_numel(t, D) - t if d == D - 1 else 0 for t in totals]
            elif k == "partition_count":
                v = [D] * len(v)
            elif k == PSM:
                v = [slice_mappings(named[g], totals[g], D, d) for g in range(len(groups))]
            else:
                _keep_locations(out, v, l0)
            osd[k] = v
        _keep_locations(out, osd[BASE]["state"], l0)  # the copied non-sharded tensors (step)
        f = {k: (osd if k == "optimizer_state_dict" else v) for k, v in l0.obj.items()}
        out[f"{src.tag}/{optim_name(src.bf16, d, tt)}"] = f


def _matches(patterns, name):
    return any(re.match(p, name) for p in patterns or ())


def _sub_params(uc, name):
    """The first parameter_with_sub_params entry with a pattern matching name (ds_to_universal's
    get_matched_sub_params_pattern), or None."""
    for e in uc.get("parameter_with_sub_params") or ():
        if _matches(e["patterns"], name):
            return e
    return None


def _sub_sizes(e, name, T):
    """The sub-parameters' sizes along partition_dim (a tuple there), each divisible by T."""
    sizes = e["shape"][e["partition_dim"]]
    if not isinstance(sizes, tuple):
        raise ViewError(f"{name}: an integer at partition_dim")
    if any(s % T for s in sizes):
        raise ViewError(f"{name}: sub-parameter sizes {sizes} do not split in {T}")
    return sizes


def sub_merge(e, name, slices):
    """ds_to_universal's merge of TP slices holding every sub-parameter's 1/T along
    partition_dim: each slice viewed as the entry's shape with that dimension cut in T, then per
    sub-parameter every slice's share in turn."""
    dim, T = e["partition_dim"], len(slices)
    sizes = _sub_sizes(e, name, T)
    logical = [sum(d) if isinstance(d, tuple) else d for d in e["shape"]]
    logical[dim] //= T
    views = [s.reshape(logical) for s in slices]
    pieces, off = [], 0
    for size in sizes:
        pieces += [v.narrow(dim, off, size // T) for v in views]
        off += size // T
    return torch.cat(pieces, dim)


def sub_cut(e, name, full, T):
    """The full tensor cut for TP=T as DeepSpeed's universal loading cuts it: every
    sub-parameter in T along partition_dim, rank t's shares concatenated. T tensors."""
    dim, sizes = e["partition_dim"], _sub_sizes(e, name, T)
    subs = full.split(list(sizes), dim)
    return [torch.cat([s.chunk(T, dim)[t] for s in subs], dim) for t in range(T)]


def reference_universal(root):
    """What ROOT/.views/universal must hold: ds_to_universal.py --inject_missing_state's output
    for the latest tag, generalised to every tensor state key."""
    src = Source(root)
    tag = src.tag
    out = Expected(tag)
    out["latest_universal"] = tag.encode()
    for tt in range(src.tp):
        out[f"{tag}/{model_name(tt)}"] = (src.root / tag / model_name(tt)).read_bytes()
    uc = src.models[0].obj.get("universal_checkpoint_info") or \
        {"universal_checkpoint_version": UC_VERSION}
    sd0 = src.osd(0, 0)
    o = {}
    for k, v in sd0.items():
        if k in (BASE, PSM, SINGLE):
            continue
        o[k] = [0] * len(v) if k == "group_paddings" else \
            [src.dp] * len(v) if k == "partition_count" else v
    o["param_groups"] = sd0[BASE]["param_groups"]
    out[f"{tag}/zero/optimizer_state.pt"] = o
    # fragments (extract_zero_shards): name -> key -> tp -> [(dp, tensor)]; steps: name -> value
    frags, steps, shapes = {}, {}, {}
    for tt in range(src.tp):
        for g, shp in enumerate(src.shapes(tt)):
            for n, s in shp.items():
                shapes.setdefault(n, []).append(s)
        for r in range(src.dp):
            sd = src.osd(tt, r)
            for g, mapping in enumerate(sd[PSM]):
                st = sd[BASE]["state"][g]
                flat = {"fp32": sd[SINGLE][g]}
                flat.update((k, v) for k, v in st.items() if _is_sharded(v))
                for name, frag in mapping.items():
                    for k, v in flat.items():
                        frags.setdefault(name, {}).setdefault(k, {}).setdefault(tt, []).append(
                            v.narrow(0, frag.start, frag.numel).clone())
                    if "step" in st and name not in steps:
                        steps[name] = st["step"]
    for name, by_key in frags.items():
        for k, by_tp in by_key.items():
            slices = [torch.cat(by_tp[tt]).reshape(shapes[name][tt]) for tt in range(src.tp)]
            d = {}
            if _matches(uc.get("tp_replicated_parameter_patterns"), name):
                for s in slices[1:]:
                    if not torch.equal(s, slices[0]):
                        raise ViewError(f"{name}: {k} differs between TP ranks, but the "
                                        f"universal_checkpoint_info says it is replicated")
                param = slices[0]
            elif _matches(uc.get("parameter_to_average_patterns"), name):
                param = sum(slices) / len(slices)
            elif (e := _sub_params(uc, name)) is not None:
                d["sub_param_shape"] = SubparamShape(patterns=e["patterns"], shape=e["shape"],
                                                     partition_dim=e["partition_dim"])
                param = sub_merge(e, name, slices)
            else:
                d["cat_dim"] = 1 if _matches(uc.get("parameter_with_row_parallelism_patterns"),
                                             name) else 0
                param = torch.cat(slices, d["cat_dim"])
            if _matches(uc.get("vocabulary_parameter_patterns"), name):
                param = param[:uc["original_vocab_size"], :]
                d["vocab_tensor"] = True
            d["param"] = param
            out[f"{tag}/zero/{name}/{k}.pt"] = d
        if name in steps:
            out[f"{tag}/zero/{name}/step.pt"] = steps[name]
    return out


def padded_vocab(ms, T):
    """Megatron's vocabulary padded for TP=T: original_vocab_size rounded up to a multiple of
    args.make_vocab_size_divisible_by (default 128) x T."""
    m = getattr(ms.get("args"), "make_vocab_size_divisible_by", 128) * T
    return -(-ms["universal_checkpoint_info"]["original_vocab_size"] // m) * m


def tp_cut(uc, name, slices, T, padded):
    """The source TP slices of `name` merged as the universal view does, then cut for TP=T as
    load_hp_checkpoint_state does (vocabulary zero-padded to `padded` rows): T tensors."""
    if _matches(uc.get("tp_replicated_parameter_patterns"), name):
        return [slices[0]] * T
    if _matches(uc.get("parameter_to_average_patterns"), name):
        return [sum(slices) / len(slices)] * T
    if (e := _sub_params(uc, name)) is not None:
        return sub_cut(e, name, sub_merge(e, name, slices), T)
    dim = 1 if _matches(uc.get("parameter_with_row_parallelism_patterns"), name) else 0
    if _matches(uc.get("parameter_with_2_sub_params_cat_dim_0"), name):
        halves, dim = [s.chunk(2, 0) for s in slices], 0
        subs = [torch.cat([h[i] for h in halves]) for i in (0, 1)]
    else:
        full = torch.cat(slices, dim)
        if _matches(uc.get("vocabulary_parameter_patterns"), name):
            full = full[:uc["original_vocab_size"]]
            full = torch.cat([full, full.new_zeros((padded - len(full),) + full.shape[1:])])
        subs = [full]
    if any(s.shape[dim] % T for s in subs):
        raise ViewError(f"{name}: dimension {dim} of {list(subs[0].shape)} does not divide by {T}")
    return [torch.cat([s.chunk(T, dim)[t] for s in subs], dim) for t in range(T)]


def reference_tp(root, T, D):
    """What ROOT/.views/tpT-dpD must hold: DeepSpeed's files after loading the universal form at
    TP=T, DP=D and saving again; rank t's files are templated on source TP rank t*T_s//T's."""
    src = Source(root)
    ms0, Ts, tag = src.models[0].obj, src.tp, src.tag
    uc = ms0.get("universal_checkpoint_info")
    if uc is None:
        raise ViewError(f"{tag}/{model_name(0)} has no universal_checkpoint_info")
    if Ts == 1 and T > 1 and not {"tp_replicated_parameter_patterns",
                                  "parameter_with_row_parallelism_patterns"} & set(uc):
        raise ViewError("saved at TP 1 and its universal_checkpoint_info lists neither "
                        "tp_replicated_parameter_patterns nor "
                        "parameter_with_row_parallelism_patterns")
    if any(m.obj.get("frozen_param_shapes") for m in src.models):
        raise ViewError("frozen parameters (frozen_param_shapes)")
    padded, cache = padded_vocab(ms0, T), {}
    mods = [{p: d[k] for p, d, k in _leaves(m.obj["module"])} for m in src.models]

    def cut(n, k):  # k: 'fp32', a state key or 'module'
        if (n, k) not in cache:
            if k == "module" and _matches(uc.get("parameter_to_average_patterns"), n):
                # the universal load leaves the fp32 mean, rounded, in the 16-bit weight
                cache[n, k] = [x.to(mods[0][n].dtype) for x in cut(n, "fp32")]
            else:
                cache[n, k] = tp_cut(uc, n, [mods[s][n] if k == "module" else src.local(s, n, k)
                                             for s in range(Ts)], T, padded)
        return cache[n, k]
    out = Expected(tag)
    out["latest"] = src.latest
    root_files(out, src.root)
    for t in range(T):
        lm = Loaded(src.root / tag / model_name(t * Ts // T))
        ms, l0 = lm.obj, src.optim[t * Ts // T][0]
        _keep_locations(out, ms, lm)
        for p, d, k in list(_leaves(ms["module"])):
            if any(p in shp for shp in src.shapes(0)):
                old, d[k] = d[k], cut(p, "module")[t].clone()
                if lm.location(old):
                    out.locations[id(d[k])] = lm.location(old)
        ms["param_shapes"] = [type(shp)((n, torch.Size(cut(n, "fp32")[t].shape)) for n in shp)
                              for shp in src.shapes(0)]
        ms["dp_world_size"], ms["mp_world_size"] = D, T
        if isinstance(ms.get("args"), argparse.Namespace):
            ms["args"].tensor_model_parallel_size, ms["args"].padded_vocab_size = T, padded
        ms["universal_checkpoint_info"]["padded_vocab_size"] = padded
        if "tp_degree" in (ms.get("checkpoint_parallel_dimensions") or {}):
            ms["checkpoint_parallel_dimensions"]["tp_degree"] = T
        out[f"{tag}/{model_name(t)}"] = ms
        st0 = l0.obj["optimizer_state_dict"][BASE]["state"]
        full = [{k: torch.cat([cut(n, k)[t].reshape(-1) for n in shp])
                 for k in ["fp32"] + [k for k, v in st0[g].items() if _is_sharded(v)]}
                for g, shp in enumerate(ms["param_shapes"])]
        _optim_files(out, src, l0, ms["param_shapes"], full, D, t)
    return out


def _leaves(d, prefix=""):
    """(key path joined with '.', dict, key) of every non-dict entry of a nested module dict."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", d, k


def write_expected(expected, out_dir):
    """Saves a reference as files (the view as it should be), storages at their locations."""
    for rel, obj in expected.items():
        p = Path(out_dir) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(obj, bytes):
            p.write_bytes(obj)
            continue
        _save(obj, p, [t for t in _tensors(obj) if expected.locations.get(id(t), "cpu") != "cpu"])


# ------------------------------------------------------------------------------------------------
# The same checkpoint as a pipeline module saves it (Megatron-DeepSpeed's GPTModelPipe) [PIPE]
# ------------------------------------------------------------------------------------------------

# Where each module entry lives in GPTModelPipe: (layer index, key in its layer file); the
# parameter's name in param_shapes is then "<index>.<key>", or "tied_modules.embed.<key>" for
# the tied embedding (index 1: spec 0 is the _to_float16 function, which has no file).
_EMBED = "language_model.embedding."


def pipe_place(name):
    if name.startswith(_EMBED):
        return 1, name[len(_EMBED):]
    assert name.startswith(_L), name
    return 2, name[len(_L):]


def pipe_name(name):
    idx, key = pipe_place(name)
    return f"tied_modules.embed.{key}" if idx == 1 else f"{idx}.{key}"


# universal_checkpoint_info's patterns for these names, as Megatron-DeepSpeed writes them for
# GPTModelPipe at TP > 1 [MDS] (the lists the fixture's model needs).
PIPE_PATTERNS = {
    "vocabulary_parameter_patterns": [r"tied_modules.embed.word_embeddings.weight"],
    "pipeline_replicated_parameter_patterns": [r"tied_modules.embed.word_embeddings.weight",
                                               r"tied_modules.embed.position_embeddings.weight"],
    "tp_replicated_parameter_patterns": [r"\d+.input_layernorm.weight",
                                         "tied_modules.embed.position_embeddings.weight"],
    "parameter_with_row_parallelism_patterns": [r"\d+.self_attention.dense.weight"],
}


def to_pipe(tree):
    """A tree {relative path: bytes or object} of this fixture's (flat, GPTModel) checkpoint or
    view as GPTModelPipe saves it: each model-states file's module moved into
    layer_XX-model_TT-model_states.pt files (an OrderedDict of the layer's entries, in module
    order) and set to None, and parameter names and patterns made the pipeline's."""
    out = Expected(tree.tag)
    out.locations = tree.locations
    for rel, obj in tree.items():
        name = rel.rsplit("/", 1)[-1]
        if isinstance(obj, bytes) or not isinstance(obj, dict):
            out[rel] = obj
        elif re.fullmatch(r"mp_rank_\d\d_model_states\.pt", name):
            tt = int(name[8:10])
            ms = dict(obj)
            layers = {}
            for k, v in ms["module"].items():
                idx, key = pipe_place(k)
                layers.setdefault(idx, collections.OrderedDict())[key] = v
            for idx, sd in layers.items():
                out[f"{rel.rsplit('/', 1)[0]}/layer_{idx:02d}-model_{tt:02d}-model_states.pt"] = sd
            ms["module"] = None
            ms["buffer_names"] = [pipe_place(n)[1] for n in ms["buffer_names"]]
            ms["param_shapes"] = [type(g)((pipe_name(n), v) for n, v in g.items())
                                  for g in ms["param_shapes"]]
            uc = dict(ms["universal_checkpoint_info"])
            uc.update((k, list(v)) for k, v in PIPE_PATTERNS.items()
                      if k in uc or k == "pipeline_replicated_parameter_patterns")
            ms["universal_checkpoint_info"] = uc
            out[rel] = ms
        elif name.endswith("_optim_states.pt"):
            f = dict(obj)
            osd = dict(f["optimizer_state_dict"])
            osd[PSM] = [type(m)((pipe_name(n), v) for n, v in m.items()) for m in osd[PSM]]
            f["optimizer_state_dict"] = osd
            out[rel] = f
        else:
            out[rel] = obj
    return out


def load_tree(root):
    """Every file under ROOT as {relative path: bytes, or the torch.load object of a .pt}."""
    root = Path(root)
    tree = Expected((root / "latest").read_text().strip())
    for rel in sorted(_files_under(root)):
        tree[rel] = Loaded(root / rel).obj if rel.endswith(".pt") else (root / rel).read_bytes()
    return tree


# ------------------------------------------------------------------------------------------------
# Comparison
# ------------------------------------------------------------------------------------------------

def _bits(t):
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def _qual(x):
    return f"{type(x).__module__}.{type(x).__qualname__}"


def assert_same(got, want, path="root", got_loaded=None, locations=None):
    """Exact equality: types (int/float/bool/enum/torch.Size/OrderedDict/classes by module and
    qualname), dict key order, objects' __dict__ in order, tensors' dtype, shape and bits, and
    (with got_loaded) each non-empty tensor's recorded storage location."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)} is not a tensor"
        assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {list(got.shape)} != {list(want.shape)}"
        assert got.requires_grad == want.requires_grad, f"{path}: requires_grad"
        assert torch.equal(_bits(got), _bits(want)), f"{path}: values differ"
        if got_loaded is not None and got.numel():
            want_loc = (locations or {}).get(id(want), "cpu")
            loc = got_loaded.location(got)
            assert loc == want_loc, f"{path}: storage location {loc}, expected {want_loc}"
        return
    assert _qual(got) == _qual(want), f"{path}: {_qual(got)} != {_qual(want)}"
    if isinstance(want, dict):
        assert list(got.keys()) == list(want.keys()), \
            f"{path}: keys {list(got.keys())} != {list(want.keys())}"
        gm, wm = getattr(got, "_metadata", None), getattr(want, "_metadata", None)
        assert gm == wm, f"{path}._metadata: {gm} != {wm}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}", got_loaded, locations)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{path}[{i}]", got_loaded, locations)
    elif isinstance(want, enum.Enum):
        assert got is want, f"{path}: {got!r} != {want!r}"
    elif isinstance(want, (int, float, str, bytes, set, frozenset, torch.dtype, type(None))):
        assert got == want, f"{path}: {got!r} != {want!r}"
    elif hasattr(want, "__dict__"):
        assert_same(vars(got), vars(want), f"{path}.__dict__", got_loaded, locations)
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def _files_under(d):
    out = set()
    for dirpath, _, files in os.walk(d):
        for f in files:
            out.add(os.path.relpath(os.path.join(dirpath, f), d))
    return out


def compare_tree(view, expected, ignore=(), framework_written=False):
    """Every file of view against the expected dict: the same set of files, bytes or objects,
    sharing the same objects and storages (sharing.py; framework_written: view is a tree the
    generator wrote, checked against a reference)."""
    view = Path(view)
    got, want = _files_under(view) - set(ignore), set(expected) - set(ignore)
    assert got == want, f"{view}: extra {sorted(got - want)}, missing {sorted(want - got)}"
    for rel in sorted(want):
        p, w = view / rel, expected[rel]
        if rel.endswith(".pt"):
            with zipfile.ZipFile(p) as z:
                assert z.testzip() is None, f"{rel}: bad CRC in the zip"
        if isinstance(w, bytes):
            assert p.read_bytes() == w, f"{rel}: bytes differ"
        else:
            g = Loaded(p)
            assert_same(g.obj, w, rel, g, expected.locations)
            sharing.assert_same_sharing(g.obj, w, rel, framework_written)


def _version_at_least(v, least):
    nums = [int(x) for x in re.findall(r"\d+", v)[:3]]
    return nums >= least


def _zero_to_fp32(tdir, tt, D, bf16, dp_world):
    """utils/zero_to_fp32.py for stage <= 2, one TP rank: {name: fp32 tensor}; checks the files
    a rank at the new size would load."""
    ms = torch.load(tdir / model_name(tt), map_location="cpu")
    assert ms["dp_world_size"] == dp_world == D, f"{model_name(tt)}: dp_world_size"
    sds = [torch.load(tdir / optim_name(bf16, d, tt), map_location="cpu")["optimizer_state_dict"]
           for d in range(ms["dp_world_size"])]
    out = {}
    for sd in sds:
        assert _version_at_least(sd["ds_version"], [0, 3, 17]), sd["ds_version"]
        assert isinstance(sd[BASE], dict) and \
            len(sd[BASE]["param_groups"]) == len(ms["param_shapes"])
        assert max(sd["partition_count"]) == D
    for g, shapes in enumerate(ms["param_shapes"]):
        total = sum(_numel(s) for s in shapes.values())
        ps = partition_size(total, D)
        for d, sd in enumerate(sds):
            assert sd[SINGLE][g].numel() <= ps, f"rank {d} group {g}: fp32 partition too long"
            for k, v in sd[BASE]["state"][g].items():
                if _is_sharded(v):
                    assert v.numel() == ps, f"rank {d} group {g} {k}: {v.numel()} != {ps}"
        vec = torch.cat([sd[SINGLE][g] for sd in sds])
        off = 0
        for name, s in shapes.items():
            out[name] = vec.narrow(0, off, _numel(s)).view(s)
            off += _numel(s)
        assert aligned_numel(off, D) == aligned_numel(vec.numel(), D), "zero2_align mismatch"
    return out


def _expected_local(src, model, tt, name, kind):
    """The local (TP rank tt) tensor of kind ('fp32' or a state key): from the model when given,
    else from the source files."""
    if model is not None:
        return model.local(name, "master" if kind == "fp32" else kind, tt)
    return src.local(tt, name, kind)


def compare_dp(root, view_dir, D, model=None):
    """ROOT/.views/dpD (or view_dir) against reference_dp, then DeepSpeed's load at DP=D: the fp32
    params rebuilt from the D files equal the model's masters (model: a Generated; without it,
    the source's own zero_to_fp32 rebuild)."""
    root = Path(root)
    view = Path(view_dir) if view_dir else root / ".views" / f"dp{D}"
    ref = reference_dp(root, D)
    compare_tree(view, ref)
    src = Source(root)
    tdir = view / ref.tag
    for tt in range(src.tp):
        dpw = torch.load(tdir / model_name(tt), map_location="cpu")["dp_world_size"]
        got = _zero_to_fp32(tdir, tt, D, src.bf16, dpw)
        for name, t in got.items():
            want = _expected_local(src, model, tt, name, "fp32")
            assert torch.equal(_bits(t), _bits(want)), f"dp{D} mp_rank {tt}: {name} fp32 differs"


def compare_universal(root, view_dir=None, model=None):
    """ROOT/.views/universal (or view_dir) against reference_universal, then DeepSpeed's universal
    load (universal_checkpoint.py) for every TP rank against the model (or the source)."""
    root = Path(root)
    view = Path(view_dir) if view_dir else root / ".views" / "universal"
    ref = reference_universal(root)
    compare_tree(view, ref)
    src = Source(root)
    uc = src.models[0].obj.get("universal_checkpoint_info") or {}
    zdir = view / ref.tag / "zero"
    for tt in range(src.tp):
        for shapes in src.shapes(tt):
            for name, shape in shapes.items():
                for f in sorted(os.listdir(zdir / name)):
                    kind, obj = f[:-3], torch.load(zdir / name / f, map_location="cpu")
                    if kind == "step":
                        want = src.osd(tt, 0)[BASE]["state"][0]["step"] if model is None \
                            else model.options.step_value()
                        assert_same(obj, want, f"{name}/step.pt")
                        continue
                    full, T, t = obj["param"], src.tp, tt
                    if full.shape == shape:
                        T, t = 1, 0
                    if _matches(uc.get("parameter_to_average_patterns"), name):
                        want = sum(_expected_local(src, model, t2, name, kind)
                                   for t2 in range(src.tp)) / src.tp
                    else:
                        want = _expected_local(src, model, tt, name, kind).clone()
                    if obj.get("vocab_tensor"):
                        rows = shape[0] * T
                        full = torch.cat([full, full.new_zeros((rows - full.shape[0],) +
                                                               tuple(full.shape[1:]))])
                        first = t * shape[0]  # rows past the original vocabulary come back 0
                        want[max(0, ORIG_VOCAB - first):] = 0
                    assert full.numel() == T * _numel(shape), f"{name}/{f}: numel"
                    if "sub_param_shape" in obj:
                        e = vars(obj["sub_param_shape"])
                        got = sub_cut(e, name, full, T)[t].reshape(shape)
                    else:
                        got = full.chunk(T, obj.get("cat_dim", 0))[t]
                    assert got.shape == shape and torch.equal(_bits(got), _bits(want)), \
                        f"universal mp_rank {tt}: {name}/{f} loads wrong values"


def compare_tp(root, view_dir, T, D, model=None):
    """ROOT/.views/tpT-dpD (or view_dir) against reference_tp; with the model (a Generated whose
    split rules the universal_checkpoint_info names), each target rank's fp32 masters rebuilt
    zero_to_fp32-style from the D files equal the model's cut for T, vocabulary padding zero."""
    root = Path(root)
    view = Path(view_dir) if view_dir else root / ".views" / f"tp{T}-dp{D}"
    ref = reference_tp(root, T, D)
    compare_tree(view, ref)
    if model is None:
        return
    src = Source(root)
    orig, padded = ORIG_VOCAB, padded_vocab(src.models[0].obj, T)
    for t in range(T):
        for name, got in _zero_to_fp32(view / ref.tag, t, D, src.bf16, D).items():
            if model.options.average and SPLIT[name] == "rep":  # the source ranks' mean
                want = sum(model.local(name, "master", s) for s in range(src.tp)) / src.tp
                assert torch.equal(_bits(got), _bits(want)), f"mp_rank {t}: {name} mean"
                continue
            want = model.model.full(name, "master")
            if SPLIT[name] == "vocab":
                want = torch.cat([want[:orig], want.new_zeros((padded - orig,) + want.shape[1:])])
            want = split(want, SPLIT[name], T, t)
            assert torch.equal(_bits(got), _bits(want)), f"tp{T}-dp{D} mp_rank {t}: {name} fp32"


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write a source checkpoint")
    g.add_argument("root")
    g.add_argument("--dp", type=int, default=4)
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--step", type=int, default=10)
    g.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    g.add_argument("--stage", type=int, choices=(1, 2), default=2)
    g.add_argument("--optimizer", choices=("fused_adam", "torch_adamw", "sgd"),
                   default="fused_adam")
    g.add_argument("--amsgrad", action="store_true")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--uc-info", action="store_true", default=None,
                   help="universal_checkpoint_info in the model states (default with --tp > 1)")
    g.add_argument("--cuda", action="store_true", help="record cuda:0 storage locations")
    g.add_argument("--py311-enum", action="store_true",
                   help="pickle ZeroStageEnum as Python 3.11 does: getattr(cls, name)")
    g.add_argument("--megatron", action="store_true", help="args; zero vocabulary padding rows")
    for verb in ("compare", "reference"):
        for kind in ("dp", "universal", "tp"):
            c = sub.add_parser(f"{verb}-{kind}")
            c.add_argument("root")
            c.add_argument(*(["out"] if verb == "reference" else ["--view"]))
            for sz in {"dp": ["dp"], "tp": ["tp", "dp"]}.get(kind, []):
                c.add_argument(f"--{sz}", type=int, required=True)
    ns = ap.parse_args(argv)
    if ns.cmd == "generate":
        generate(ns.root, ns.dp, ns.tp, ns.step, ns.dtype, ns.stage, ns.optimizer, ns.amsgrad,
                 ns.seed, ns.cuda, ns.uc_info, not ns.py311_enum, ns.megatron)
        return 0
    verb, kind = ns.cmd.split("-")
    sizes = {"dp": [ns.dp] if kind == "dp" else [], "tp": [ns.tp, ns.dp] if kind == "tp" else []}
    try:
        if verb == "reference":
            write_expected(globals()[f"reference_{kind}"](ns.root, *sizes.get(kind, [])), ns.out)
        elif kind == "universal":
            compare_universal(ns.root, ns.view)
        else:
            globals()[f"compare_{kind}"](ns.root, ns.view, *sizes[kind])
    except ViewError as e:
        print(f"invalid view: {e}", file=sys.stderr)
        return 1
    if ns.cmd.startswith("compare"):
        print("equal to the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
