#!/usr/bin/python3
"""Native DeepSpeed MoE (deepspeed.moe.layer.MoE) checkpoints at ZeRO stage 1/2, for the dpD view
tests of ckptfs.

Read at deepspeedai/DeepSpeed tag v0.14.4 (commit d254d75ef028e2e6bd3305ba0feeb6a61c986443; read,
not copied), and commit 224a05c35040b724069a277b0019e2d1984aa986 (PR #5681, in v0.14.5):
  [SAVE]   runtime/engine.py save_checkpoint (with MoE layers: _save_moe_checkpoint, then
           _save_zero_checkpoint for every rank); _save_moe_checkpoint: per MoE module (its
           ordinal in named_modules() is the layer id), expert-dp rank 0 of each EP rank writes
           one file per local expert, layer_{L}_expert_{G}_mp_rank_{MP:02d}_model_states.pt
           (_get_expert_ckpt_name), G = expp_rank * num_local_experts + k, the keys renamed from
           local k to G, the tensors cloned; expp_rank_{E}_mp_rank_{MP:02d}_optim_states.pt
           ({'optimizer': None} under ZeRO; _get_optimizer_ckpt_name); dp rank 0 writes
           mp_rank_{MP:02d}_model_states.pt: module (_get_non_moe_state_dict: keys with 'expert'
           dropped but the gate's 'moe.gate.wg.weight'), lr_scheduler, data_sampler, random_ltd,
           sparse_tensor_module_names, skipped_steps, global_steps, global_samples,
           dp_world_size, mp_world_size, num_experts, then client_state (no param_shapes).
           _save_zero_checkpoint: {optimizer_state_dict, ds_config, ds_version}.
  [SPLIT]  moe/utils.py split_params_into_different_moe_groups_for_optimizer: for each client
           group a moe group {**group, 'name': 'ep_size_{EP}', 'moe': True, 'params': experts'},
           appended after every client group, in client-group order.
  [ZERO]   runtime/zero/stage_1_and_2.py _configure_moe_settings (a moe group is partitioned
           over the expert-data-parallel group of its name: partition_count = DP / EP), __init__
           (flat buffer aligned to 2 x that group's size), state_dict (as the dense fixture),
           _link_all_hp_params: 0.14.4 cuts every group's mappings with partition_size =
           flat numel // the full DP and start = expert-dp rank x that size (so the moe groups'
           mappings name only part of the group); PR #5681 uses the group's own size.
  [GROUPS] utils/groups.py _create_expert_and_data_parallel: by default (E + D) the EP group of
           rank r is r // EP's, EP rank r % EP, expert-dp rank r // EP; with
           use_data_before_expert_parallelism (D + E) EP rank r // (DP / EP), expert-dp rank
           r % (DP / EP).
Sizes are chosen so that only the last rank of any partitioning is padded (where 0.14.4's
group_paddings and later versions' agree).

CLI: deepspeed_moe_fixture.py generate ROOT --dp 4 --ep 2 [--layers 2] [--psm 0.14.4|own]
                                        [--data-before-expert]
     deepspeed_moe_fixture.py compare-dp ROOT --dp 2 [--view DIR]
"""
import argparse
import collections
import math
import os
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepspeed_fixture as df  # noqa: E402

BASE, SINGLE, PSM = df.BASE, df.SINGLE, df.PSM
DS_VERSION = "0.14.4"
H, F, EXPERTS = 3, 7, 4
PREFIX = ".deepspeed_moe.experts.deepspeed_experts."


def _numel(shape):
    return int(math.prod(shape))


# ------------------------------------------------------------------------------------------------
# Generator
# ------------------------------------------------------------------------------------------------

@dataclass
class Options:
    dp: int = 4
    ep: int = 2
    layers: int = 2
    psm: str = "0.14.4"           # or "own": the moe groups' mappings as 0.14.5 on cut them
    data_before_expert: bool = False
    step: int = 10
    seed: int = 7

    def split(self, r, dp=None):
        dp = dp or self.dp
        n = dp // self.ep
        return (r // n, r % n) if self.data_before_expert else (r % self.ep, r // self.ep)


def params(o):
    """[(name, shape, decay, expert)] in named_parameters() order; expert params under their
    global id (layer l's expert G)."""
    out = [("embed.weight", (13, H), True, False), ("proj.weight", (9, 7), True, False)]
    for l in range(o.layers):
        p = f"layers.{l}."
        out += [(p + "norm.weight", (9,), False, False), (p + "norm.bias", (9,), False, False),
                (p + "moe.deepspeed_moe.gate.wg.weight", (EXPERTS, H), True, False)]
        for g in range(EXPERTS):
            e = f"{p}moe{PREFIX}{g}."
            out += [(e + "fc1.weight", (F, H), True, True), (e + "fc1.bias", (F,), False, True),
                    (e + "fc2.weight", (H, F), True, True), (e + "fc2.bias", (H,), False, True)]
    out += [("head.weight", (5, H), True, False), ("head.bias", (5,), False, False),
            ("final_norm.weight", (81,), False, False)]
    return out


def local_name(name, e, le):
    """An expert parameter's name on EP rank e (local index), as param_names holds it."""
    m = re.match(rf"(.*{re.escape(PREFIX)})(\d+)(\..*)", name)
    return f"{m.group(1)}{int(m.group(2)) - e * le}{m.group(3)}" if m else name


def groups_of(o, e):
    """EP rank e's four optimizer groups [(global name, local name, shape)] [SPLIT]: decay,
    no_decay (dense), then the moe groups of decay and of no_decay (its local experts)."""
    le = EXPERTS // o.ep
    mine = lambda n: int(re.search(rf"{re.escape(PREFIX)}(\d+)\.", n).group(1)) // le == e
    out = [[], [], [], []]
    for name, shape, decay, expert in params(o):
        if expert and not mine(name):
            continue
        out[(2 if expert else 0) + (0 if decay else 1)].append((name, local_name(name, e, le),
                                                                shape))
    return out


class Model:
    """Every tensor as a function of the seed and its global name and kind."""

    def __init__(self, o):
        self.o, self.shapes = o, {n: s for n, s, _, _ in params(o)}

    def full(self, name, kind):
        g = torch.Generator()
        g.manual_seed(zlib.crc32(f"{self.o.seed}/{name}/{kind}".encode()))
        shape = self.shapes[name]
        if kind == "exp_avg_sq":
            return torch.rand(shape, generator=g) * 1e-5
        return torch.randn(shape, generator=g) * (0.05 if kind == "master" else 1e-3)


def ds_config(o):
    c = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 3e-4}},
         "bf16": {"enabled": True},
         "zero_optimization": {"stage": 2, "contiguous_gradients": True, "reduce_scatter": True}}
    if o.data_before_expert:
        c["use_data_before_expert_parallelism"] = True
    return c


def window(o, total, n, q, dp):
    """The window [lo, hi) of a group's flat buffer that partition q's mappings describe [ZERO]."""
    size = df.aligned_numel(total, n) // (dp if o.psm == "0.14.4" else n)
    return q * size, (q + 1) * size


def mappings(named, lo, hi):
    out, off = collections.OrderedDict(), 0
    for name, n in named:
        if off < hi and off + n > lo:
            s, t = max(off, lo), min(off + n, hi)
            out[name] = df.fragment_address(start=s - lo, numel=t - s)
        off += n
    return out


def generate(root, **kw):
    o = Options(**kw)
    assert o.dp % o.ep == 0 and EXPERTS % o.ep == 0
    root, tag, cfg, model = Path(root), f"global_step{o.step}", ds_config(o), Model(o)
    tdir = root / tag
    tdir.mkdir(parents=True, exist_ok=True)
    n_e, le = o.dp // o.ep, EXPERTS // o.ep

    def flat(group, kind, dtype, n):
        total = sum(_numel(s) for _, _, s in group)
        parts = [model.full(g, kind).to(dtype).reshape(-1) for g, _, _ in group]
        return torch.cat(parts + [torch.zeros(df.aligned_numel(total, n) - total, dtype=dtype)])

    # Model states [SAVE]: each EP rank's module (dense params are views of the dense groups'
    # flat 16-bit buffers, its experts of its moe groups').
    for e in range(o.ep):
        groups = groups_of(o, e)
        views = {}
        for gi, group in enumerate(groups):
            buf = flat(group, "master", torch.bfloat16, o.dp if gi < 2 else n_e)
            off = 0
            for name, local, s in group:
                views[local] = buf[off:off + _numel(s)].view(s)
                off += _numel(s)
        order = [local_name(n, e, le) for n, _, _, x in params(o) if not x or local_name(n, e, le)
                 in views]
        module = df._module([(n, views[n], "param") for n in order])
        sd = module.state_dict()
        for l in range(o.layers):
            for k in range(le):
                g = e * le + k
                pre = f"layers.{l}.moe{PREFIX}"
                ex = {key.replace(f"{pre}{k}.", f"{pre}{g}."): v.clone().detach()
                      for key, v in sd.items() if key.startswith(f"{pre}{k}.")}
                torch.save(ex, tdir / f"layer_{l}_expert_{g}_mp_rank_00_model_states.pt")
        torch.save({"optimizer": None}, tdir / f"expp_rank_{e}_mp_rank_00_optim_states.pt")
        if e == 0:
            dense = collections.OrderedDict(
                (k, v) for k, v in sd.items() if "expert" not in k or "moe.gate.wg.weight" in k)
            ms = dict(module=dense, lr_scheduler={"last_batch_iteration": o.step - 1},
                      data_sampler=None, random_ltd=None, sparse_tensor_module_names=set(),
                      skipped_steps=0, global_steps=o.step, global_samples=o.step * 16,
                      dp_world_size=o.dp, mp_world_size=1, num_experts=[EXPERTS] * o.layers)
            ms["iteration"] = o.step  # client_state
            torch.save(ms, tdir / "mp_rank_00_model_states.pt")

    # Optimizer states [ZERO], one file per dp rank.
    scaler = df.loss_scaler(df.Options(dtype="bf16"))
    for r in range(o.dp):
        e, q = o.split(r)
        groups = groups_of(o, e)
        parts, single, pads, psm, states = [], [], [], [], []
        for gi, group in enumerate(groups):
            n, at = (o.dp, r) if gi < 2 else (n_e, q)
            total = sum(_numel(s) for _, _, s in group)
            ps = df.partition_size(total, n)
            part = flat(group, "master", torch.float32, n)[at * ps:(at + 1) * ps].clone()
            pad = df.rank_padding(total, n, at)
            parts.append(part)
            single.append(part[:part.numel() - pad])
            pads.append(pad)
            states.append({"step": o.step, **{k: flat(group, k, torch.float32, n)[
                at * ps:(at + 1) * ps].clone() for k in ("exp_avg", "exp_avg_sq")}})
            named = [(local, _numel(s)) for _, local, s in group]
            lo, hi = (at * ps, (at + 1) * ps) if gi < 2 else window(o, total, n, at, o.dp)
            psm.append(mappings(named, lo, hi))
        client = [{"params": [parts[0]], "name": "decay"},
                  {"params": [parts[1]], "name": "no_decay", "weight_decay": 0.0}]
        moe = [{**client[i], "name": f"ep_size_{o.ep}", "moe": True, "params": [parts[2 + i]]}
               for i in range(2)]
        opt = df._FusedAdam(client + moe, lr=3e-4, bias_correction=True, betas=[0.9, 0.999],
                            eps=1e-8, weight_decay=0.01)
        for g in opt.param_groups:
            g["step"] = o.step
        for gi in range(4):
            opt.state[parts[gi]] = states[gi]
        osd = {"loss_scaler": scaler, "dynamic_loss_scale": False, "overflow": False,
               "clip_grad": 1.0, BASE: opt.state_dict(), SINGLE: single,
               "zero_stage": df.ZeroStageEnum.gradients, "group_paddings": pads,
               "partition_count": [o.dp, o.dp, n_e, n_e], "ds_version": DS_VERSION, PSM: psm}
        torch.save({"optimizer_state_dict": osd, "ds_config": cfg, "ds_version": DS_VERSION},
                   tdir / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    df.write_recovery_script(root)
    (root / "latest").write_text(tag)
    return model


# ------------------------------------------------------------------------------------------------
# Reference: from the source files alone
# ------------------------------------------------------------------------------------------------

def _optim(d, r):
    return d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"


def _params_of(maps, windows, total):
    """[(name, numel)] the mappings of partitions in `windows` name, merged; None when they do
    not tile each window's real elements."""
    out, end = [], 0
    for m, (lo, hi) in zip(maps, windows):
        at, lo, hi = min(lo, total), min(lo, total), min(hi, total)
        for name, fa in m.items():
            if lo + fa.start != at or fa.numel <= 0:
                return None
            if out and out[-1][0] == name and end == at:
                out[-1] = (name, out[-1][1] + fa.numel)
            elif end != at:
                return None
            else:
                out.append((name, fa.numel))
            at = end = at + fa.numel
        if at != hi:
            return None
    return out


def reference_dp(root, D):
    """What ROOT/.views/dpD must hold (raises df.ViewError for what the view must refuse)."""
    root = Path(root)
    latest = (root / "latest").read_bytes()
    tag = latest.decode().strip()
    d = root / tag
    out = df.Expected(tag)
    out["latest"] = latest
    df.root_files(out, root)
    for name in os.listdir(d):
        if re.fullmatch(r"(layer_\d+_)?expert_\d+_mp_rank_\d\d_model_states\.pt|"
                        r"expp_rank_\d+_mp_rank_\d\d_optim_states\.pt", name):
            out[f"{tag}/{name}"] = (d / name).read_bytes()
    ms = df.Loaded(d / "mp_rank_00_model_states.pt")
    S = ms.obj["dp_world_size"]
    files = [df.Loaded(_optim(d, r)) for r in range(S)]
    sds = [f.obj["optimizer_state_dict"] for f in files]
    pg = sds[0][BASE]["param_groups"]
    ep = {int(g["name"][len("ep_size_"):]) for g in pg if g.get("moe")}
    if len(ep) != 1:
        raise df.ViewError(f"moe groups of ep sizes {ep}")
    ep = ep.pop()
    if D % ep:
        raise df.ViewError(f"dp{D}: not a multiple of the expert-parallel size {ep}")
    dbe = bool(files[0].obj["ds_config"].get("use_data_before_expert_parallelism"))
    opts = Options(dp=S, ep=ep, data_before_expert=dbe)

    def rank(e, q, dp):
        return next(r for r in range(dp) if opts.split(r, dp) == (e, q))

    # Per (group, domain): the merged flat tensors and the parameters.
    doms = {}
    for gi, g in enumerate(pg):
        for e in range(ep if g.get("moe") else 1):
            n = S // ep if g.get("moe") else S
            ranks = [rank(e, q, S) if g.get("moe") else q for q in range(n)]
            fp32 = torch.cat([sds[r][SINGLE][gi] for r in ranks])
            total = fp32.numel()
            keys = [k for k, v in sds[0][BASE]["state"][gi].items() if df._is_sharded(v)]
            full = {"fp32": fp32}
            for k in keys:
                full[k] = torch.cat([sds[r][BASE]["state"][gi][k][:df.partition_size(total, n) -
                                                                   sds[r]["group_paddings"][gi]]
                                     for r in ranks])
            maps = [sds[r][PSM][gi] for r in ranks]
            doms[gi, e] = dict(n=n, total=total, full=full, maps=maps, ranks=ranks)
    # The moe groups' mapping sizing: their own partitions, else the full DP (0.14.4).
    own = [_params_of(v["maps"], [window(Options(psm="own"), v["total"], v["n"], q, S)
                                  for q in range(v["n"])], v["total"])
           for (gi, e), v in doms.items() if pg[gi].get("moe")]
    sizing = "own" if all(x is not None for x in own) else "0.14.4"
    for (gi, e), v in doms.items():
        o = Options(psm=sizing if pg[gi].get("moe") else "own")
        ws = [window(o, v["total"], v["n"], q, S) for q in range(v["n"])]
        v["params"] = _params_of(v["maps"], ws, v["total"])
        if v["params"] is None:
            raise df.ViewError(f"group {gi}: param_slice_mappings do not follow the partitioning")
        v["known"], v["psm"] = min(v["total"], ws[-1][1]), o

    ms.obj["dp_world_size"] = D
    out[f"{tag}/mp_rank_00_model_states.pt"] = ms.obj
    l0 = files[0]
    for r in range(D):
        e, q = Options(dp=D, ep=ep, data_before_expert=dbe).split(r, D)
        cut = []
        for gi, g in enumerate(pg):
            v = doms[gi, e if g.get("moe") else 0]
            n, at = (D // ep, q) if g.get("moe") else (D, r)
            total, ps = v["total"], df.partition_size(v["total"], n)
            p = {k: torch.cat([t, torch.zeros(df.aligned_numel(total, n) - total, dtype=t.dtype)])[
                at * ps:(at + 1) * ps].clone() for k, t in v["full"].items()}
            lo, hi = window(v["psm"], total, n, at, D)
            if min(hi, total) > v["known"]:
                raise df.ViewError(f"dp{D}: the source's param_slice_mappings of moe group {gi} "
                                   f"name its parameters up to element {v['known']}")
            cut.append(dict(p=p, pad=df.rank_padding(total, n, at), n=n,
                            psm=mappings(v["params"], lo, hi)))
        sd0 = sds[0]
        osd = {}
        for k, val in sd0.items():
            if k == BASE:
                val = dict(val)
                val["state"] = {gi: {kk: cut[gi]["p"][kk] if kk in cut[gi]["p"] else vv
                                     for kk, vv in st.items()} for gi, st in val["state"].items()}
            elif k == SINGLE:
                val = [c["p"]["fp32"][:c["p"]["fp32"].numel() - c["pad"]] for c in cut]
            elif k == "group_paddings":
                val = [c["pad"] for c in cut]
            elif k == "partition_count":
                val = [c["n"] for c in cut]
            elif k == PSM:
                val = [c["psm"] for c in cut]
            osd[k] = val
        out[f"{tag}/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"] = {
            k: (osd if k == "optimizer_state_dict" else val) for k, val in l0.obj.items()}
    return out


def compare_dp(root, view, D, model=None):
    """VIEW against reference_dp; with the generator's model, every rank's fp32 partitions walked
    with its groups' parameters (as DeepSpeed's load at DP=D reads them) equal the masters."""
    df.compare_tree(view, reference_dp(root, D))
    if model is not None:
        check_model(view, D, model)


def check_model(view, D, model):
    """Every rank's fp32 partitions and exp_avg of VIEW (dpD), walked with its groups' parameters
    as DeepSpeed's load at DP=D reads them, equal the generator's model."""
    o = model.o
    tdir = Path(view) / f"global_step{o.step}"
    assert torch.load(tdir / "mp_rank_00_model_states.pt")["dp_world_size"] == D
    od = Options(dp=D, ep=o.ep, data_before_expert=o.data_before_expert)
    sds = [torch.load(_optim(tdir, r))["optimizer_state_dict"] for r in range(D)]
    for e in range(o.ep):
        for gi, group in enumerate(groups_of(o, e)):
            ranks = [r for r in range(D) if gi < 2 or od.split(r, D)[0] == e]
            if gi >= 2:
                ranks.sort(key=lambda r: od.split(r, D)[1])
            for kind in ("fp32", "exp_avg"):
                vec = torch.cat([sd[SINGLE][gi] if kind == "fp32" else
                                 sd[BASE]["state"][gi][kind][:sd[SINGLE][gi].numel()]
                                 for sd in (sds[r] for r in ranks)])
                off = 0
                for name, _, s in group:
                    want = model.full(name, "master" if kind == "fp32" else kind)
                    got = vec[off:off + _numel(s)].view(s)
                    assert torch.equal(got, want), f"dp{D} EP rank {e}: {name} {kind} differs"
                    off += _numel(s)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["generate", "compare-dp"])
    ap.add_argument("root")
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--psm", default="0.14.4")
    ap.add_argument("--data-before-expert", action="store_true")
    ap.add_argument("--view")
    a = ap.parse_args(argv)
    if a.cmd == "generate":
        generate(a.root, dp=a.dp, ep=a.ep, layers=a.layers, psm=a.psm,
                 data_before_expert=a.data_before_expert)
    else:
        compare_dp(a.root, a.view or Path(a.root) / ".views" / f"dp{a.dp}", a.dp)


if __name__ == "__main__":
    main()
