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
import copy
import math
import os
import re
from pathlib import Path

import torch

import deepspeed_fixture as df
import sharing

PAD_VALUE = 77.0  # what the generator leaves in partition padding, so that reading it shows


def model_name(d):
    return f"zero_pp_rank_{d}_mp_rank_00_model_states.pt"


def _part(numel, dp):
    return -(-numel // dp)


def sub_groups(dp, sub_group_size, groups=None):
    """[(param group, [(name, shape)])] in DeepSpeed's sub-group order [ZERO3]; groups: each
    param group's [(name, shape)] (default: the fixture model's)."""
    out = []
    for g, params in enumerate(groups if groups is not None else df.group_params(1, 0)):
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
             sub_group_size=1_000_000_000, pad=PAD_VALUE):
    """Writes ROOT/global_step{step}/... and then ROOT/latest; returns a df.Generated. pad: the
    value left in partition padding."""
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
        out = torch.full((n,), pad, dtype=dtype)
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
            # a tied output head, as global rank 0 alone records it [ENGINE]
            shared_params={"lm_head.weight": df.PARAMS[0][0]} if d == 0 else {},
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
    df.write_recovery_script(root)
    with open(root / "latest", "w") as f:
        f.write(tag)
    return df.Generated(root, tag, o, model)


# ------------------------------------------------------------------------------------------------
# Reference: from the source files alone
# ------------------------------------------------------------------------------------------------

def reference_universal(root):
    """What ROOT/.views/universal must hold for a stage 3 source: ds_to_universal's output,
    generalised to every tensor state key."""
    tag, tdir, model_files, optim_files = _source(root)
    models = [n for n, _ in model_files]
    dp = len(models)
    optims = [o.obj["optimizer_state_dict"] for _, o in optim_files]
    out = df.Expected(tag)
    out["latest_universal"] = tag.encode()
    for m in models:
        out[f"{tag}/{m}"] = (tdir / m).read_bytes()
    o = dict(optims[0])
    o["param_groups"] = o["optimizer_state_dict"]["param_groups"]
    out[f"{tag}/zero/optimizer_state.pt"] = o
    shapes = model_files[0][1].obj["param_shapes"]
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


def _source(root):
    """ROOT's latest tag: (tag, tag dir, [(name, Loaded)] of the model-states files and of the
    optimizer files, by rank)."""
    root = Path(root)
    tag = (root / "latest").read_text().strip()
    tdir = root / tag
    names = os.listdir(tdir)
    models = sorted((n for n in names
                     if re.fullmatch(r"zero_pp_rank_\d+_mp_rank_00_model_states\.pt", n)),
                    key=lambda n: int(n.split("_")[3]))
    optims = []
    for r in range(len(models)):
        n = [m for m in names
             if re.fullmatch(rf"(bf16_|fp16_)?zero_pp_rank_{r}_mp_rank_00_optim_states\.pt", m)]
        if len(n) != 1:
            raise df.ViewError(f"{tag}: optimizer file of rank {r}: {n}")
        optims.append((n[0], df.Loaded(tdir / n[0])))
    return tag, tdir, [(m, df.Loaded(tdir / m)) for m in models], optims


def reference_dp(root, D):
    """What ROOT/.views/dpD must hold for a stage 3 source, from the source files alone: the
    files DeepSpeed writes at dp size D [ENGINE][ZERO3]. Every parameter re-cut into D
    partitions of ceil(numel / D), padded with zeros; the sub-groups those of sub_group_size at
    D (ds_config; DeepSpeed's default 1e9); rank 0's other entries, and shared_params as
    DeepSpeed fills them (rank 0 only)."""
    tag, tdir, model_files, optims = _source(root)
    models = [m for _, m in model_files]
    S = len(models)
    ms0, (oname, o0) = models[0].obj, optims[0]
    inner0 = o0.obj["optimizer_state_dict"]["optimizer_state_dict"]
    shapes = ms0["param_shapes"]
    groups = [[(n, s) for i in pg["params"] for n, s in shapes[i].items()]
              for pg in inner0["param_groups"]]
    size = ms0["ds_config"].get("zero_optimization", {}).get("sub_group_size", 1_000_000_000)
    have = [list(shapes[i].items()) for pg in inner0["param_groups"] for i in pg["params"]]
    if [p for _, p in sub_groups(S, size, groups)] != have:
        raise df.ViewError(f"{tag}: sub-groups do not follow sub_group_size {size}")
    where = {}  # name -> (source sub-group, offset of its partition)
    for g, shp in enumerate(shapes):
        off = 0
        for name, s in shp.items():
            where[name] = (g, off)
            off += _part(math.prod(s), S)

    def full(name, key):
        """The parameter's `key` elements, from every source rank's partition."""
        g, off = where[name]
        numel = math.prod(dict(sum(groups, []))[name])
        sds = [o.obj["optimizer_state_dict"] for _, o in optims]
        flat = [sd["fp32_flat_groups"][g] if key == "fp32" else
                sd["optimizer_state_dict"]["state"][g][key] for sd in sds]
        return torch.cat([f.narrow(0, off, _part(numel, S)) for f in flat])[:numel]

    def cut(t, d):
        n = _part(t.numel(), D)
        out = torch.zeros(n, dtype=t.dtype)
        piece = t[d * n:(d + 1) * n]
        out[:piece.numel()] = piece
        return out

    frozen = {n: torch.cat([m.obj["frozen_param_fragments"][n] for m in models])
              [:math.prod(s)] for n, s in ms0["frozen_param_shapes"].items()}
    subs = sub_groups(D, size, groups)
    out = df.Expected(tag)
    out["latest"] = (Path(root) / "latest").read_bytes()
    df.root_files(out, root)
    OD = collections.OrderedDict
    for d in range(D):
        ms = dict(ms0)
        ms["dp_world_size"] = D
        ms["param_shapes"] = [OD(params) for _, params in subs]
        ms["frozen_param_fragments"] = OD((n, cut(t, d)) for n, t in frozen.items())
        if d > 0:
            ms["shared_params"] = models[1].obj["shared_params"] if S > 1 else {}
        out[f"{tag}/{model_name(d)}"] = ms
        osd = dict(o0.obj["optimizer_state_dict"])
        flats, state = [], {}
        params_of = [[] for _ in inner0["param_groups"]]
        for i, (pg, params) in enumerate(subs):
            params_of[pg].append(i)
            flats.append(torch.cat([cut(full(n, "fp32"), d) for n, _ in params]))
            if inner0["state"]:
                first = inner0["state"][where[params[0][0]][0]]
                # Every sub-group's state is an object of its own, 'step' included: torch
                # steps each in place [ZERO3].
                state[i] = {k: torch.cat([cut(full(n, k), d) for n, _ in params])
                            if df._is_sharded(v) else copy.deepcopy(v) for k, v in first.items()}
        osd["partition_count"] = D
        osd["fp32_flat_groups"] = flats
        osd["optimizer_state_dict"] = {
            "state": state,
            "param_groups": [{**pg, "params": params_of[j]}
                             for j, pg in enumerate(inner0["param_groups"])]}
        out[f"{tag}/{oname.replace('rank_0_', f'rank_{d}_', 1)}"] = \
            {**o0.obj, "optimizer_state_dict": osd}
    return out


def compare_dp(root, D, view_dir=None, expected_dir=None):
    """ROOT/.views/dpD (or view_dir) against reference_dp; then, with expected_dir (what
    `generate` wrote at dp D from the same model, padding zeros), every view file loaded
    against that file loaded."""
    root = Path(root)
    view = Path(view_dir) if view_dir else root / ".views" / f"dp{D}"
    ref = reference_dp(root, D)
    df.compare_tree(view, ref)
    if expected_dir is None:
        return
    exp = Path(expected_dir)
    got, want = df._files_under(view), df._files_under(exp)
    assert got == want, f"extra {sorted(got - want)}, missing {sorted(want - got)}"
    for rel in sorted(want):
        if rel.endswith(".pt"):
            g, w = df.Loaded(view / rel).obj, df.Loaded(exp / rel).obj
            df.assert_same(g, w, rel)
            sharing.assert_same_sharing(g, w, rel)
        else:
            assert (view / rel).read_bytes() == (exp / rel).read_bytes(), rel


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
