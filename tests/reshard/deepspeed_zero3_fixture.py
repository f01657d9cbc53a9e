"""DeepSpeed ZeRO stage 3 checkpoints for the universal view tests.

The same three parts as deepspeed_fixture.py, for stage 3 (no tensor parallelism):

* GENERATOR (`generate`): deepspeed_fixture's model written as DeepSpeed's engine writes a stage 3
  checkpoint at DP=dp: ROOT/latest, and in ROOT/global_stepN/ one
  zero_pp_rank_D_mp_rank_00_model_states.pt and one [bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt
  per dp rank.
* REFERENCE (`reference_universal`): from the source files alone, what ROOT/.views/universal must
  hold, as ds_to_universal.py's stage 3 path writes it.
* COMPARE (`compare_universal`): the view against the reference, then every parameter's files
  against the generator's model.

Facts taken from DeepSpeed's own code (deepspeedai/DeepSpeed 0.19.6; read, not copied):
  [ENGINE] runtime/engine.py: _get_ckpt_name (stage 3: zero_pp_rank_{dp}_mp_rank_{mp:02d}
           _model_states.pt, written by every dp rank, never with a bf16_ prefix);
           _get_zero_ckpt_prefix (bf16_ for the optimizer file); _common_checkpoint_state (the
           same keys as stage 1/2; frozen_param_fragments = each frozen parameter's ds_tensor,
           the rank's padded partition; shared_params filled on global rank 0 only);
           _get_zero_param_shapes (stage 3: one OrderedDict per sub-group, name -> ds_shape).
           checkpoint_event_prologue frees every parameter before the save, so `module` holds
           shape-[0] tensors of the parameters' dtype; buffers are whole.
  [ZERO3]  runtime/zero/stage3.py: _rigid_state_dict (keys zero_stage = ZeroStageEnum.weights,
           loss_scaler, dynamic_loss_scale, overflow, partition_count (an int), the torch
           optimizer's state_dict over the sub-groups' flat fp32 partitions, fp32_flat_groups);
           _create_fp16_sub_groups (a sub-group closes once its partition sizes reach
           sub_group_size, or at its group's last parameter; default 1e9: one per group).
           runtime/zero/partition_parameters.py: a parameter is padded to a multiple of the dp
           size and cut into dp partitions of ceil(numel / dp); the padding is never written
           (torch.empty), so its values are arbitrary.
  [UNIV]   checkpoint/ds_to_universal.py: extract_zero_shards_stage3 (per sub-group, offsets
           advance by the partition size, each rank's slice without padding), merge_zero3_slices
           (the dp slices concatenated; zero/<name>/<state>.pt holds the bare 1-D tensor; no
           step.pt), _save_optimizer_state_stage3 (rank 0's optimizer_state_dict whole, with its
           inner optimizer's param_groups added as 'param_groups'), every *model_states.pt
           copied, latest_universal.
  As for stages 1/2, the views write one <key>.pt per tensor state key the checkpoint holds
  (ds_to_universal hard-codes fp32, exp_avg and exp_avg_sq).
"""
import collections
import math
import os
import re
from pathlib import Path

import torch

import deepspeed_fixture as df

PAD_VALUE = 77.0  # what the generator leaves in partition padding, so that reading it shows


def model_name(d):
    return f"zero_pp_rank_{d}_mp_rank_00_model_states.pt"


def _part(numel, dp):
    return -(-numel // dp)


def sub_groups(dp, sub_group_size):
    """[(param group, [(name, shape)])] in DeepSpeed's sub-group order [ZERO3]."""
    out = []
    for g, params in enumerate(df.group_params(1, 0)):
        total = sum(_part(df._numel(s), dp) for _, s in params)
        if sub_group_size >= total:
            out.append((g, list(params)))
            continue
        cur, size = [], 0
        for i, (n, s) in enumerate(params):
            cur.append((n, s))
            size += _part(df._numel(s), dp)
            if size >= sub_group_size or i == len(params) - 1:
                out.append((g, cur))
                cur, size = [], 0
    return out


def generate(root, dp=4, step=10, dtype="bf16", optimizer="fused_adam", seed=1234,
             sub_group_size=1_000_000_000):
    """Writes ROOT/global_step{step}/... and then ROOT/latest; returns a df.Generated."""
    o = df.Options(dp=dp, tp=1, step=step, dtype=dtype, stage=2, optimizer=optimizer, seed=seed)
    o.stage = 3
    root, tag = Path(root), f"global_step{step}"
    model = df.FullModel(seed)
    tdir = root / tag
    tdir.mkdir(parents=True, exist_ok=True)
    cfg = df.ds_config(o)
    cfg["zero_optimization"] = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                "sub_group_size": sub_group_size}
    dt, subs = o.torch_dtype, sub_groups(dp, sub_group_size)

    def partition(full, d, dtype):
        """Rank d's partition of a parameter: its flat elements [d * part, + part), padded."""
        flat = full.reshape(-1).to(dtype)
        n = _part(flat.numel(), dp)
        out = torch.full((n,), PAD_VALUE, dtype=dtype)
        piece = flat[d * n:(d + 1) * n]
        out[:piece.numel()] = piece
        return out

    frozen = [(n, s) for n, s, _, g in df.PARAMS if g is None]
    OD = collections.OrderedDict
    scaler = df.loss_scaler(o)
    for d in range(dp):
        # model states [ENGINE]: parameters freed to shape [0]; buffers whole
        entries = [(n, torch.empty(0, dtype=dt), "param" if g is not None else "frozen")
                   for n, _, _, g in df.PARAMS]
        entries += [(n, model.full(n, "buffer").to(dt), "buffer" if p else "buffer_np")
                    for n, _, p in df.BUFFERS]
        ms = dict(
            module=df._module(entries).state_dict(),
            buffer_names=[n for n, _, p in df.BUFFERS if p], optimizer=None,
            param_shapes=[OD((n, torch.Size(s)) for n, s in params) for _, params in subs],
            frozen_param_shapes=OD((n, torch.Size(s)) for n, s in frozen),
            shared_params={},
            frozen_param_fragments=OD((n, partition(model.full(n, "master"), d, dt))
                                      for n, _ in frozen),
            lr_scheduler={"last_batch_iteration": step - 1}, data_sampler=None, random_ltd=None,
            sparse_tensor_module_names=set(), skipped_steps=o.skipped, global_steps=step,
            global_samples=step * 64, dp_world_size=dp, mp_world_size=1, ds_config=cfg,
            ds_version=df.DS_VERSION)
        ms["iteration"] = step  # client_state
        torch.save(ms, tdir / model_name(d))

        # optimizer states [ZERO3]
        flats = [torch.cat([partition(model.full(n, "master"), d, torch.float32)
                            for n, _ in params]) for _, params in subs]
        by_group = [[f for (g, _), f in zip(subs, flats) if g == k] for k in (0, 1)]
        opt = df.make_optimizer(o, by_group)
        for (g, params), f in zip(subs, flats):
            st = {}
            if o.step_value() is not None:
                st["step"] = o.step_value()
            for k in o.state_kinds():
                st[k] = torch.cat([partition(model.full(n, k), d, torch.float32)
                                   for n, _ in params])
            opt.state[f] = st
        osd = {"zero_stage": df.ZeroStageEnum.weights, "loss_scaler": scaler,
               "dynamic_loss_scale": scaler.dynamic, "overflow": False, "partition_count": dp,
               "optimizer_state_dict": opt.state_dict(), "fp32_flat_groups": flats}
        torch.save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": df.DS_VERSION},
                   tdir / df.optim_name(o, d, 0))
    with open(root / "latest", "w") as f:
        f.write(tag)
    return df.Generated(root, tag, o, model)


# ------------------------------------------------------------------------------------------------
# Reference: from the source files alone
# ------------------------------------------------------------------------------------------------

def reference_universal(root):
    """What ROOT/.views/universal must hold for a stage 3 source: ds_to_universal's output,
    generalised to every tensor state key."""
    root = Path(root)
    tag = (root / "latest").read_text().strip()
    tdir = root / tag
    names = os.listdir(tdir)
    models = sorted((n for n in names if re.fullmatch(r"zero_pp_rank_\d+_mp_rank_00_model_states\.pt",
                                                         n)),
                    key=lambda n: int(n.split("_")[3]))
    dp = len(models)
    optims = []
    for r in range(dp):
        n = [m for m in names if re.fullmatch(rf"(bf16_)?zero_pp_rank_{r}_mp_rank_00_optim_states\.pt",
                                               m)]
        if len(n) != 1:
            raise df.ViewError(f"{tag}: optimizer file of rank {r}: {n}")
        optims.append(df.Loaded(tdir / n[0]).obj["optimizer_state_dict"])
    out = df.Expected(tag)
    out["latest_universal"] = tag.encode()
    for m in models:
        out[f"{tag}/{m}"] = (tdir / m).read_bytes()
    o = dict(optims[0])
    o["param_groups"] = o["optimizer_state_dict"]["param_groups"]
    out[f"{tag}/zero/optimizer_state.pt"] = o
    shapes = df.Loaded(tdir / models[0]).obj["param_shapes"]
    for idx, shp in enumerate(shapes):
        keys = ["fp32"] + [k for k, v in optims[0]["optimizer_state_dict"]["state"][idx].items()
                           if isinstance(v, torch.Tensor) and v.dim() > 0]
        off = 0
        for name, s in shp.items():
            numel = math.prod(s)
            pn = -(-numel // dp)
            for k in keys:
                flat = [sd["fp32_flat_groups"][idx] if k == "fp32" else
                        sd["optimizer_state_dict"]["state"][idx][k] for sd in optims]
                out[f"{tag}/zero/{name}/{k}.pt"] = torch.cat(
                    [f.narrow(0, off, pn) for f in flat])[:numel].clone()
            off += pn
    return out


def compare_universal(root, view_dir=None, model=None):
    """ROOT/.views/universal against reference_universal; with the model (a df.Generated), every
    parameter's state files, reshaped, against the model's tensors."""
    root = Path(root)
    view = Path(view_dir) if view_dir else root / ".views" / "universal"
    ref = reference_universal(root)
    df.compare_tree(view, ref)
    if model is None:
        return
    zdir = view / ref.tag / "zero"
    for name, shape, _, g in df.PARAMS:
        if g is None:
            assert not (zdir / name).exists(), f"frozen {name} has universal files"
            continue
        for kind in ["master"] + model.options.state_kinds():
            f = zdir / name / f"{'fp32' if kind == 'master' else kind}.pt"
            got = torch.load(f, map_location="cpu")
            want = model.model.full(name, kind)
            assert got.dim() == 1 and torch.equal(got.view(shape), want), \
                f"universal {name}/{f.name} loads wrong values"
