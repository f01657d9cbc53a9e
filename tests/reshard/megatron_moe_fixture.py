#!/usr/bin/python3
"""Megatron-LM legacy (--ckpt-format torch) checkpoints of a mixture-of-experts GPT for the
tpT-ppP-epE view tests.

`save_checkpoint(root, cfg, tp, pp, ep)` writes one random full model (megatron.core names)
sharded for TP x PP x EP the way Megatron's save_checkpoint does. The tests write the same model
at the source shape and at the target shape and compare the view of the first with the second,
bit for bit: no reference resharding in between.

Facts taken from Megatron-LM's own code (NVIDIA/Megatron-LM; read, not copied):
  [NAME]   megatron/training/checkpointing.py get_checkpoint_name: mp_rank_{tp:02d}, then
           _{pp:03d} with pipeline parallelism, then _{ep:03d} with expert parallelism (EP > 1);
           TT is the dense TP rank. With expert TP = TP every (tp, pp, ep) rank writes, and every
           file holds its dense TP shard.
  [MOE]    megatron/core/transformer/moe/moe_layer.py: local expert k of EP rank r is global
           expert r * E/EP + k; children router, experts, shared_experts. router.py: weight [E, H]
           (replicated), the persistent fp32 buffer expert_bias [E] with
           moe_router_enable_expert_bias. shared_experts.py: gate_weight [1, H] (its own
           parameter, before linear_fc1/linear_fc2), dense TP group.
  [EXPERT] megatron/core/transformer/moe/experts.py: SequentialMLP local_experts.{k}.linear_fc1
           (fc1 [2F/TP, H], GLU shard [gate_t; up_t]) and linear_fc2 ([H, F/TP]);
           TEGroupedMLP linear_fc1.weight{k}, linear_fc2.weight{k} and each module's
           _extra_state; the legacy GroupedMLP (before 2caa681a1d) weight1 [H, Le * 2F/TP] read
           as view(Le, H, -1) and weight2 [Le * F/TP, H] read as view(Le, -1, H): each expert's
           weights transposed, one block per expert; its sharded_state_dict maps the blocks to
           the same [gate_t; up_t] rows.
  [OPT]    megatron/core/optimizer/__init__.py: allreduce=False (expert weights at EP > 1;
           tensor_parallel/layers.py, extensions/transformer_engine.py) puts a parameter in the
           experts' param groups (is_expert_parallel True) and optimizer; ChainedOptimizer.
           state_dict (optimizer.py) saves [dense, experts] for two optimizers, the one
           optimizer's state dict for one. Groups by first appearance as megatron_fixture [OPT].
  [DISTOPT] With --use-distributed-optimizer each sub-optimizer is a DistributedOptimizer
           (megatron_distopt.py's [STATE], [DPZERO], [LAYOUT] per sub-optimizer: the experts'
           buffer holds the expert parameters of the rank, the dense one the rest);
           ChainedOptimizer.save_parameter_state (optimizer.py) saves the list of their
           parameter states, None for a sub-optimizer whose data-parallel group's rank 0 this rank
           is not, and nothing when all are None. The dense group's rank 0 is on EP rank 0 (with
           ETP = TP, parallel_state.py's generators give dense DP rank = ep + EP * expert-DP
           rank), the experts' group's rank 0 (expert-DP rank 0) on every EP rank: EP rank 0's
           file holds [dense, experts], the others' [None, experts]; a stage without experts
           saves the dense state alone, on EP rank 0 only.
  [ARGS]   arguments.py: expert_tensor_parallel_size defaults to tensor_model_parallel_size;
           num_experts, moe_ffn_hidden_size, moe_layer_freq, moe_grouped_gemm,
           moe_shared_expert_intermediate_size, moe_shared_expert_gate,
           moe_router_enable_expert_bias (transformer_config.py).
"""
import argparse
import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

import megatron_distopt as md
import megatron_fixture as mf
import sharing

FILE = mf.FILE
TRACKER = mf.TRACKER


@dataclass
class MoeConfig:
    num_layers: int = 4
    hidden_size: int = 32
    num_attention_heads: int = 4
    num_query_groups: int = 2
    ffn_hidden_size: int = 64       # the dense layers'
    moe_ffn_hidden_size: int = 16   # each expert's
    num_experts: int = 8
    form: str = "sequential"        # "sequential", "te" (TEGroupedMLP) or "grouped" (GroupedMLP)
    swiglu: bool = True
    shared_size: int = 0            # moe_shared_expert_intermediate_size (0: no shared experts)
    shared_gate: bool = False
    expert_bias: bool = False
    layer_freq: object = 1          # moe_layer_freq: 1 (every layer) or a list of 0/1 per layer
    qkv_bias: bool = False          # args.add_qkv_bias: linear_qkv.bias (Qwen2-MoE's attention)
    qk_layernorm: bool = False      # args.qk_layernorm: q_layernorm/k_layernorm (Qwen3-MoE's)
    topk: int = 2                   # moe_router_topk
    pre_softmax: bool = False       # moe_router_pre_softmax
    vocab_size: int = 500
    make_vocab_size_divisible_by: int = 32
    untie: bool = True
    data_parallel_size: int = 8
    seed: int = 77
    distributed_optimizer: bool = False  # [DISTOPT]
    ep_shift: int = 0               # test hook: EP rank e holds the experts of rank e + shift (a
                                    # wrong numbering the comparisons must catch)
    extra_args: dict = field(default_factory=dict)

    def moe_layer(self, g):
        if isinstance(self.layer_freq, list):
            return bool(self.layer_freq[g])
        return g % self.layer_freq == 0

    def padded_vocab(self, tp):
        m = self.make_vocab_size_divisible_by * tp
        return (self.vocab_size + m - 1) // m * m

    def as_dense_config(self):
        """megatron_fixture's config of the dense part (for its args and value generator)."""
        return mf.ModelConfig(
            era="mcore", num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads, num_query_groups=self.num_query_groups,
            ffn_hidden_size=self.ffn_hidden_size, swiglu=self.swiglu, vocab_size=self.vocab_size,
            make_vocab_size_divisible_by=self.make_vocab_size_divisible_by, untie=self.untie,
            bias=False, normalization="RMSNorm", position_embedding_type="rope",
            qkv_bias=self.qkv_bias, qk_layernorm=self.qk_layernorm,
            distributed_optimizer=self.distributed_optimizer,
            data_parallel_size=self.data_parallel_size, seed=self.seed)


class Values:
    """Deterministic random values of the full model, per (name, kind): kind 'master' (the fp32
    main copy; the bf16 weight is its rounding), 'exp_avg', 'exp_avg_sq'."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.cache = {}
        self.vocab_rows = max(cfg.padded_vocab(t) for t in range(1, 17))

    def get(self, name, kind, shape):
        key = (name, kind)
        if key not in self.cache:
            g = mf._gen(self.cfg.seed, name, kind)
            scale = {"master": 0.05, "exp_avg": 1e-3, "exp_avg_sq": 1e-5}[kind]
            t = torch.randn(shape, generator=g) * scale
            if kind == "exp_avg_sq":
                t = t.abs()
            self.cache[key] = t
        return self.cache[key]


def _glu_shard(v, name, kind, rows, cols, tp, t, glu):
    """Column-parallel fc1 shard t of tp: [gate_t; up_t] with GLU."""
    if glu:
        gate = v.get(name + ".gate", kind, (rows, cols))
        up = v.get(name + ".up", kind, (rows, cols))
        return torch.cat([gate.chunk(tp)[t], up.chunk(tp)[t]]).clone()
    return v.get(name, kind, (rows, cols)).chunk(tp)[t].clone()


def _row_shard(v, name, kind, rows, cols, tp, t):
    return v.get(name, kind, (rows, cols)).chunk(tp, dim=1)[t].clone()


def rank_params(cfg, v, tp, pp, ep, t, p, e, kind):
    """[(key, tensor or None, is_expert_param, is_buffer)] of rank (t, p, e) in state-dict order;
    tensors of `kind` (None: _extra_state None)."""
    H, F, Fe, S = cfg.hidden_size, cfg.ffn_hidden_size, cfg.moe_ffn_hidden_size, cfg.shared_size
    E, glu = cfg.num_experts, cfg.swiglu
    hd = H // cfg.num_attention_heads
    qh = cfg.num_attention_heads // cfg.num_query_groups
    le = E // ep
    per = cfg.num_layers // pp
    out = []
    add = lambda k, x, expert=False, buf=False: out.append((k, x, expert, buf))
    te_extra = lambda: torch.empty(0, dtype=torch.uint8)
    if p == 0:
        table = v.get("word", kind, (v.vocab_rows, H))
        rows = cfg.padded_vocab(tp) // tp
        add("embedding.word_embeddings.weight", table[t * rows:(t + 1) * rows].clone())
    for i in range(per):
        g = p * per + i
        L = f"decoder.layers.{i}."
        add(L + "input_layernorm.weight", v.get(f"{g}.in_norm", kind, (H,)).clone())
        add(L + "self_attention.linear_proj.weight",
            _row_shard(v, f"{g}.proj", kind, H, H, tp, t))
        add(L + "self_attention.linear_proj._extra_state", None)
        q = v.get(f"{g}.q", kind, (cfg.num_attention_heads * hd, H))
        k_ = v.get(f"{g}.k", kind, (cfg.num_query_groups * hd, H))
        v_ = v.get(f"{g}.v", kind, (cfg.num_query_groups * hd, H))
        qkv = []
        for grp in range(cfg.num_query_groups):
            qkv += [q[grp * qh * hd:(grp + 1) * qh * hd], k_[grp * hd:(grp + 1) * hd],
                    v_[grp * hd:(grp + 1) * hd]]
        add(L + "self_attention.linear_qkv.weight", torch.cat(qkv).chunk(tp)[t].clone())
        if cfg.qkv_bias:  # interleaved per query group like the weight's rows
            qb = v.get(f"{g}.q_bias", kind, (cfg.num_attention_heads * hd,))
            kb = v.get(f"{g}.k_bias", kind, (cfg.num_query_groups * hd,))
            vb = v.get(f"{g}.v_bias", kind, (cfg.num_query_groups * hd,))
            b = []
            for grp in range(cfg.num_query_groups):
                b += [qb[grp * qh * hd:(grp + 1) * qh * hd], kb[grp * hd:(grp + 1) * hd],
                      vb[grp * hd:(grp + 1) * hd]]
            add(L + "self_attention.linear_qkv.bias", torch.cat(b).chunk(tp)[t].clone())
        add(L + "self_attention.linear_qkv._extra_state", None)
        if cfg.qk_layernorm:  # per head, replicated
            add(L + "self_attention.q_layernorm.weight", v.get(f"{g}.q_norm", kind, (hd,)).clone())
            add(L + "self_attention.k_layernorm.weight", v.get(f"{g}.k_norm", kind, (hd,)).clone())
        add(L + "pre_mlp_layernorm.weight", v.get(f"{g}.mlp_norm", kind, (H,)).clone())
        if not cfg.moe_layer(g):
            add(L + "mlp.linear_fc1.weight", _glu_shard(v, f"{g}.fc1", kind, F, H, tp, t, glu))
            add(L + "mlp.linear_fc1._extra_state", None)
            add(L + "mlp.linear_fc2.weight", _row_shard(v, f"{g}.fc2", kind, H, F, tp, t))
            add(L + "mlp.linear_fc2._extra_state", None)
            continue
        add(L + "mlp.router.weight", v.get(f"{g}.router", kind, (E, H)).clone())
        if cfg.expert_bias:  # a buffer: no optimizer state; fp32 whatever the kind
            add(L + "mlp.router.expert_bias", v.get(f"{g}.expert_bias", "master", (E,)).clone(),
                buf=True)
        first = (e + cfg.ep_shift) % ep * le
        experts = range(first, first + le)
        fc1 = lambda x: _glu_shard(v, f"{g}.expert{x}.fc1", kind, Fe, H, tp, t, glu)
        fc2 = lambda x: _row_shard(v, f"{g}.expert{x}.fc2", kind, H, Fe, tp, t)
        X = L + "mlp.experts."
        if cfg.form == "sequential":
            for k, x in enumerate(experts):
                add(X + f"local_experts.{k}.linear_fc1.weight", fc1(x), True)
                add(X + f"local_experts.{k}.linear_fc1._extra_state", None)
                add(X + f"local_experts.{k}.linear_fc2.weight", fc2(x), True)
                add(X + f"local_experts.{k}.linear_fc2._extra_state", None)
        elif cfg.form == "te":
            for k, x in enumerate(experts):
                add(X + f"linear_fc1.weight{k}", fc1(x), True)
            add(X + "linear_fc1._extra_state", "te")
            for k, x in enumerate(experts):
                add(X + f"linear_fc2.weight{k}", fc2(x), True)
            add(X + "linear_fc2._extra_state", "te")
        else:  # GroupedMLP: each expert's weights transposed, one contiguous block per expert
            w1 = torch.stack([fc1(x).t().contiguous() for x in experts])   # [Le, H, 2F/T]
            w2 = torch.stack([fc2(x).t().contiguous() for x in experts])   # [Le, F/T, H]
            add(X + "weight1", w1.reshape(H, -1).clone(), True)
            add(X + "weight2", w2.reshape(-1, H).clone(), True)
        if S:
            Sx = L + "mlp.shared_experts."
            if cfg.shared_gate:
                add(Sx + "gate_weight", v.get(f"{g}.shared_gate", kind, (1, H)).clone())
            add(Sx + "linear_fc1.weight", _glu_shard(v, f"{g}.shared.fc1", kind, S, H, tp, t, glu))
            add(Sx + "linear_fc1._extra_state", None)
            add(Sx + "linear_fc2.weight", _row_shard(v, f"{g}.shared.fc2", kind, H, S, tp, t))
            add(Sx + "linear_fc2._extra_state", None)
    if p == pp - 1:
        add("decoder.final_layernorm.weight", v.get("final_norm", kind, (H,)).clone())
        if cfg.untie:
            table = v.get("out", kind, (v.vocab_rows, H))
            rows = cfg.padded_vocab(tp) // tp
            add("output_layer.weight", table[t * rows:(t + 1) * rows].clone())
        elif pp > 1:  # the head's copy of the tied word embeddings
            table = v.get("word", kind, (v.vocab_rows, H))
            rows = cfg.padded_vocab(tp) // tp
            add("output_layer.weight", table[t * rows:(t + 1) * rows].clone())
        add("output_layer._extra_state", None)
    out = [(k, te_extra() if x == "te" else x, ex, b) for k, x, ex, b in out]
    return out


def _optimizer(params, expert_groups, iteration):
    """One Float16OptimizerWithFloat16Params state dict over params [(name, master, exp_avg,
    exp_avg_sq)], groups by weight-decay class in order of first appearance."""
    groups = collections.OrderedDict()
    for i, (name, m, _, _) in enumerate(params):
        groups.setdefault(0.0 if mf._no_wd(name, m) else 1.0, []).append(i)
    pg = []
    for wd_mult, idxs in groups.items():
        pg.append({"params": [params[i][1] for i in idxs], "wd_mult": wd_mult, "lr_mult": 1.0,
                   "is_expert_parallel": expert_groups, "is_decoupled_lr": False,
                   "max_lr": mf.LR, "min_lr": mf.MIN_LR})
    opt = torch.optim.AdamW(pg, lr=mf.LR, weight_decay=mf.WD, betas=(0.9, 0.95), eps=1e-8)
    for g in opt.param_groups:
        g["lr"] = mf.LR * 0.5 * g["lr_mult"]
        g["weight_decay"] = mf.WD * g["wd_mult"]
    for idxs in groups.values():
        for i in idxs:
            _, m, ea, eas = params[i]
            opt.state[m] = {"step": torch.tensor(float(iteration)), "exp_avg": ea,
                            "exp_avg_sq": eas}
    return {"optimizer": opt.state_dict(),
            "fp32_from_fp16_params": [[params[i][1] for i in idxs] for idxs in groups.values()]}


def make_args(cfg, tp, pp, ep, iteration):
    a = mf.make_args(cfg.as_dense_config(), tp, pp, iteration)
    a.expert_model_parallel_size = ep
    a.expert_tensor_parallel_size = tp
    a.num_experts = cfg.num_experts
    a.moe_ffn_hidden_size = cfg.moe_ffn_hidden_size
    a.moe_layer_freq = cfg.layer_freq
    a.moe_router_topk = cfg.topk
    a.moe_router_pre_softmax = cfg.pre_softmax
    a.moe_router_score_function = "softmax"
    a.moe_router_topk_scaling_factor = None
    a.moe_expert_capacity_factor = None
    a.moe_aux_loss_coeff = 0.01
    a.moe_grouped_gemm = cfg.form != "sequential"
    a.moe_use_legacy_grouped_gemm = cfg.form == "grouped"
    a.moe_shared_expert_intermediate_size = cfg.shared_size or None
    a.moe_shared_expert_gate = cfg.shared_gate
    a.moe_router_enable_expert_bias = cfg.expert_bias
    a.moe_mlp_glu_interleave_size = None
    for k, x in cfg.extra_args.items():
        setattr(a, k, x)
    return a


def build_rank(cfg, values, tp, pp, ep, t, p, e, iteration=100):
    return build_rank_files(cfg, values, tp, pp, ep, t, p, e, iteration)[0]


def _distopt(cfg, pp, p, params, expert_groups, iteration):
    """[DISTOPT] one DistributedOptimizer's `optimizer` entry and parameter state."""
    dcfg = cfg.as_dense_config()
    dcfg.extra_args = dict(cfg.extra_args)
    groups = _optimizer(params, expert_groups, iteration)["optimizer"]["param_groups"]
    states = {"param": [m for _, m, _, _ in params], "exp_avg": [a for _, _, a, _ in params],
              "exp_avg_sq": [s for _, _, _, s in params]}
    opt, dist, _ = md.rank_state(dcfg, pp, p, [(k, m.numel()) for k, m, _, _ in params], states,
                                 groups, iteration)
    return opt, dist


def build_rank_files(cfg, values, tp, pp, ep, t, p, e, iteration=100):
    """Rank (t, p, e)'s model_optim_rng.pt state dict and its distrib_optim.pt's (None: no such
    file)."""
    masters = rank_params(cfg, values, tp, pp, ep, t, p, e, "master")
    ea = rank_params(cfg, values, tp, pp, ep, t, p, e, "exp_avg")
    eas = rank_params(cfg, values, tp, pp, ep, t, p, e, "exp_avg_sq")
    model, dense, experts = [], [], []
    for (k, m, ex, buf), (_, a, _, _), (_, s, _, _) in zip(masters, ea, eas):
        if m is None or m.dtype == torch.uint8 or buf:  # extra state, buffers: no parameter
            model.append((k, m))
            continue
        w = m.to(torch.bfloat16)
        model.append((k, w))
        (experts if ex and ep > 1 else dense).append((k, m, a, s))
    distrib = None
    if cfg.distributed_optimizer:
        optimizer, dense_state = _distopt(cfg, pp, p, dense, False, iteration)
        distrib = dense_state if e == 0 else None
        if experts:
            expert_opt, expert_state = _distopt(cfg, pp, p, experts, True, iteration)
            optimizer = [optimizer, expert_opt]
            distrib = [distrib, expert_state]
    else:
        optimizer = _optimizer(dense, False, iteration)
        if experts:  # [OPT] ChainedOptimizer of two: a list
            optimizer = [optimizer, _optimizer(experts, True, iteration)]
    return {
        "args": make_args(cfg, tp, pp, ep, iteration),
        "checkpoint_version": 3.0,
        "iteration": iteration,
        "model": mf._state_dict(model),
        "optimizer": optimizer,
        "opt_param_scheduler": {"max_lr": mf.LR, "min_lr": mf.MIN_LR, "num_steps": iteration * 8},
        "rng_state": mf._rng_state(cfg.seed),  # the same on every rank: comparable across shapes
        "num_floating_point_operations_so_far": 1234.0 * iteration,
    }, distrib


def rank_name(t, p, e, pp, ep):
    """[NAME] get_checkpoint_name."""
    s = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
    return s + (f"_{e:03d}" if ep > 1 else "")


def save_checkpoint(root, cfg, tp, pp, ep, iteration=100, mutate=None):
    """Writes cfg's model at TP x PP x EP under root. mutate(sd, t, p, e), when given, may change
    a rank's state dict before it is saved (the tests' deliberately wrong checkpoints)."""
    values = Values(cfg)
    for p in range(pp):
        for e in range(ep):
            for t in range(tp):
                sd, distrib = build_rank_files(cfg, values, tp, pp, ep, t, p, e, iteration)
                if mutate:
                    mutate(sd, t, p, e)
                d = Path(root) / f"iter_{iteration:07d}" / rank_name(t, p, e, pp, ep)
                d.mkdir(parents=True, exist_ok=True)
                torch.save(sd, d / FILE)
                if distrib is not None:
                    torch.save(distrib, d / mf.DISTRIB_FILE)
    (Path(root) / TRACKER).write_text(str(iteration))


def rank_dirs(root, tp, pp, ep, iteration=100):
    it = Path(root) / f"iter_{iteration:07d}"
    return {(t, p, e): it / rank_name(t, p, e, pp, ep)
            for p in range(pp) for e in range(ep) for t in range(tp)}


def _distopt_groups_by_settings(sd):
    """A DistributedOptimizer's `optimizer` entry holds no per-parameter state, only the param
    groups, which Megatron matches by their settings, not by position (test_views_distopt.py):
    its groups sorted by their settings, in place."""
    opt = sd.get("optimizer")
    for o in opt if isinstance(opt, list) else [opt]:
        inner = o.get("optimizer") if isinstance(o, dict) else None
        if isinstance(inner, dict) and "state" not in inner and "param_groups" in inner:
            inner["param_groups"].sort(key=lambda g: sorted((k, repr(v)) for k, v in g.items()))


def compare(view_root, want_root, shape, source_shape, iteration=100):
    """Every rank file of the view iteration against the checkpoint written at that shape: values,
    types, key order, sharing. The model dict's _metadata is the primary source rank's (the
    views take the pickle's structure from it; docs/views.md)."""
    T, P, E = shape
    Ts, Ps, Es = source_shape
    it = f"iter_{iteration:07d}"
    got_names = sorted(x.name for x in (Path(view_root) / it).iterdir())
    want = rank_dirs(want_root, T, P, E, iteration)
    assert got_names == sorted(d.name for d in want.values()), got_names
    src = rank_dirs(Path(view_root).parent.parent, Ts, Ps, Es, iteration)
    for (t, p, e), d in want.items():
        name = d.name
        got = mf.Loaded(Path(view_root) / it / name / FILE)
        exp = mf.Loaded(d / FILE).obj
        primary = (t * Ts // T, p * Ps // P, e * Es // E)
        exp["model"]._metadata = torch.load(src[primary] / FILE)["model"]._metadata
        _distopt_groups_by_settings(got.obj)
        _distopt_groups_by_settings(exp)
        mf.assert_same(got.obj, exp, name)
        sharing.assert_same_sharing(got.obj, exp, name)
        files = sorted(os.listdir(Path(view_root) / it / name))
        assert files == sorted(os.listdir(d)), (name, files)
        if mf.DISTRIB_FILE in files:
            got = mf.Loaded(Path(view_root) / it / name / mf.DISTRIB_FILE).obj
            exp = mf.Loaded(d / mf.DISTRIB_FILE).obj
            mf.assert_same(got, exp, name + "/" + mf.DISTRIB_FILE)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--form", default="sequential")
    ns = ap.parse_args(argv)
    save_checkpoint(ns.root, MoeConfig(form=ns.form), ns.tp, ns.pp, ns.ep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
