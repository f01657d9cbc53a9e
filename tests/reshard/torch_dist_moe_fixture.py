"""Writes a megatron.core mixture-of-experts GPT in the `torch_dist` format: the model of
tests/reshard/megatron_moe_fixture.py (the same values, so the same model written as rank files
there is the reference), laid out across the ranks of a TP x PP x EP (x expert TP) run with
torch_dist_fixture.write_iteration. The facts beyond torch_dist_fixture's, read in Megatron-LM's
source (NVIDIA/Megatron-LM; read, not copied):

- [BLOCK] transformer/transformer_block.py sharded_state_dict: the layers are stacked on a leading
  layer axis (decoder.layers.X, offset (0, global layer, L)) unless they differ: moe_layer_freq
  a list or > 1 (also linear attention, heterogeneous specs, singleton_local_shards); then each
  layer is saved under decoder.layers.{g}.X without that axis.
- [SPEC] models/gpt/gpt_layer_specs.py: with Transformer Engine the attention's input norm is
  linear_qkv.layer_norm_weight; an MoE layer has pre_mlp_layernorm.weight (TENorm); a dense
  layer of a mixed model (get_gpt_decoder_block_spec builds it with num_experts None) fuses its
  norm into mlp.linear_fc1.layer_norm_weight.
- [EXPERTS] transformer/moe/experts.py SequentialMLP.sharded_state_dict and TEGroupedMLP's
  (extensions/transformer_engine.py _sharded_state_dict_grouped; "interchangeable"): key
  mlp.experts.experts.linear_fc1.weight / linear_fc2.weight, an expert axis
  (len(sharded_offsets), global expert, E) after the layer axis: [L, E, 2F, H] and [L, E, H, F]
  stacked, [E, 2F, H] and [E, H, F] per layer. Local expert k of EP rank e is global expert
  e * E/EP + k. The experts' TP group is the expert TP (ETP, default TP); transformer/mlp.py
  apply_swiglu_sharded_factory gives ETP rank r two chunks, its gate rows at r * F/ETP and its up
  rows at (ETP + r) * F/ETP. Each expert's _extra_state is a ShardedObject at the same offsets,
  {key}/shard_{l}.{x}_{L}.{E} (transformer/utils.py _get_extra_state_offsets; without any offset
  shard_0_1). Expert weights are written by expert-data-parallel rank 0.
  form "grouped": the legacy GroupedMLP (before 2caa681a1d) saved the same keys and global
  shapes, an EP rank's Le experts as one chunk (its offsets (axis, ep_rank, EP) then the TP cut).
- [ROUTER] transformer/moe/moe_layer.py children router, experts, shared_experts; router.py
  weight [E, H] (replicated: one chunk per layer); shared_experts.py gate_weight [1, H] and
  linear_fc1 / linear_fc2 on the dense TP group, SwiGLU's fc1 cut as a dense layer's.
- [RANKS] core/parallel_state.py: the dense ranks of a pipeline stage are ordered tp, dp and the
  expert ranks etp, ep, edp over the same ranks (TP x DP = ETP x EP x EDP), so stage rank r is
  dense (r % TP, r // TP) and expert (r % ETP, r // ETP % EP, r // (ETP * EP)); global rank
  r + TP * DP * pp. RNG states rng_state/shard_{pp}.{tp}_{PP}.{TP} (training/checkpointing.py)
  by DP rank 0.
- [PARALLEL] dist_checkpointing/strategies/fully_parallel.py (--ckpt-fully-parallel-save, on by
  default): each ShardedTensor's main replica is saved by one of the data-parallel ranks that
  hold it, spread for uniform sizes (greedy, largest first); here each dense tensor goes to the
  DP rank with the fewest bytes so far, expert weights stay with their one holder. Readers must
  not depend on which file holds a chunk.

    /usr/bin/python3 tests/reshard/torch_dist_moe_fixture.py ROOT --tp 2 --pp 1 --ep 2 \\
        [--etp 1] [--config JSON] [--common-in-dcp]

Runs in its own process (torch_dist_fixture's stand-ins for torch's DCP classes).
"""
import argparse
import dataclasses
import json
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import megatron_moe_fixture as mm  # noqa: E402
import torch_dist_fixture as tdf  # noqa: E402


def per_layer(cfg):
    """[BLOCK] whether the layers are saved under keys of their own."""
    return isinstance(cfg.layer_freq, list) or cfg.layer_freq > 1


def data_parallel(T, EP, ETP):
    """[RANKS] the smallest DP with TP x DP a multiple of ETP x EP; and EDP."""
    dp = 1
    while (T * dp) % (ETP * EP):
        dp += 1
    return dp, T * dp // (ETP * EP)


def layer_items(cfg, v, T, ETP, EP, g):
    """Layer g's items as [(key, global shape, offsets, chunk, holder)] in state-dict order, at
    its global keys and shapes with the layer axis; holder ("dense", t) or ("expert", et, e) says
    which ranks hold it (dense: every DP rank of TP rank t; expert: expert TP rank et of EP rank
    e)."""
    H, F, Fe, S, E = (cfg.hidden_size, cfg.ffn_hidden_size, cfg.moe_ffn_hidden_size,
                      cfg.shared_size, cfg.num_experts)
    L, heads, groups = cfg.num_layers, cfg.num_attention_heads, cfg.num_query_groups
    hd, qh, le = H // heads, heads // groups, E // EP
    bf = lambda name, shape: v.get(name, "master", shape).to(torch.bfloat16)  # noqa: E731
    out = []
    lay = "decoder.layers."

    def add(key, shape, offsets, chunk, holder):
        out.append((lay + key, [L] + list(shape), [g] + list(offsets),
                    chunk.contiguous()[None], holder))

    def tp_rows(key, full, tp=T, holder=lambda t: ("dense", t), glu=False, lead=()):
        """`full` cut along dim 0 (glu: gate half and up half each) into tp chunks; lead: index
        axes (the expert's) before the rows."""
        rows = full.shape[0] // (2 if glu else 1)
        step = rows // tp
        pad = [1] * len(lead)
        for t in range(tp):
            for half in ((0, 1) if glu else (0,)):
                at = half * rows + t * step
                piece = full[at:at + step].reshape(*pad, step, *full.shape[1:])
                out.append((lay + key, [L] + [E] * len(lead) + list(full.shape),
                            [g] + list(lead) + [(half * tp + t) * step] + [0] * (full.dim() - 1),
                            piece.contiguous()[None], holder(t)))

    def tp_cols(key, full, tp=T, holder=lambda t: ("dense", t), lead=()):
        step = full.shape[1] // tp
        pad = [1] * len(lead)
        for t in range(tp):
            piece = full[:, t * step:(t + 1) * step].reshape(*pad, full.shape[0], step)
            out.append((lay + key, [L] + [E] * len(lead) + list(full.shape),
                        [g] + list(lead) + [0, t * step], piece.contiguous()[None], holder(t)))

    add("self_attention.linear_qkv.layer_norm_weight", [H], [0], bf(f"{g}.in_norm", (H,)),
        ("dense", 0))
    tp_cols("self_attention.linear_proj.weight", bf(f"{g}.proj", (H, heads * hd)))
    q, k, w = (bf(f"{g}.q", (heads * hd, H)), bf(f"{g}.k", (groups * hd, H)),
               bf(f"{g}.v", (groups * hd, H)))
    tp_rows("self_attention.linear_qkv.weight", torch.cat(
        [x for n in range(groups) for x in (q[n * qh * hd:(n + 1) * qh * hd],
                                            k[n * hd:(n + 1) * hd], w[n * hd:(n + 1) * hd])]))
    if cfg.qkv_bias:
        qb, kb, vb = (bf(f"{g}.q_bias", (heads * hd,)), bf(f"{g}.k_bias", (groups * hd,)),
                      bf(f"{g}.v_bias", (groups * hd,)))
        tp_rows("self_attention.linear_qkv.bias", torch.cat(
            [x for n in range(groups) for x in (qb[n * qh * hd:(n + 1) * qh * hd],
                                                kb[n * hd:(n + 1) * hd], vb[n * hd:(n + 1) * hd])]))
    if cfg.qk_layernorm:
        for n in ("q", "k"):
            add(f"self_attention.{n}_layernorm.weight", [hd], [0], bf(f"{g}.{n}_norm", (hd,)),
                ("dense", 0))
    if not cfg.moe_layer(g):
        add("mlp.linear_fc1.layer_norm_weight", [H], [0], bf(f"{g}.mlp_norm", (H,)), ("dense", 0))
        tp_rows("mlp.linear_fc1.weight", torch.cat([bf(f"{g}.fc1.gate", (F, H)),
                                                    bf(f"{g}.fc1.up", (F, H))]), glu=True)
        tp_cols("mlp.linear_fc2.weight", bf(f"{g}.fc2", (H, F)))
        return out
    add("pre_mlp_layernorm.weight", [H], [0], bf(f"{g}.mlp_norm", (H,)), ("dense", 0))
    add("mlp.router.weight", [E, H], [0, 0], bf(f"{g}.router", (E, H)), ("dense", 0))
    if cfg.expert_bias:
        add("mlp.router.expert_bias", [E], [0], v.get(f"{g}.expert_bias", "master", (E,)),
            ("dense", 0))
    X = "mlp.experts.experts."
    fc1 = lambda x: torch.cat([bf(f"{g}.expert{x}.fc1.gate", (Fe, H)),  # noqa: E731
                               bf(f"{g}.expert{x}.fc1.up", (Fe, H))])
    fc2 = lambda x: bf(f"{g}.expert{x}.fc2", (H, Fe))  # noqa: E731
    owner = lambda x: lambda et: ("expert", et, x // le)  # noqa: E731
    if cfg.form == "grouped":  # an EP rank's experts as one chunk, cut for TP (= ETP)
        step = Fe // ETP
        for e in range(EP):
            xs = range(e * le, (e + 1) * le)
            for t in range(ETP):
                for half in (0, 1):
                    at = half * Fe + t * step
                    block = torch.stack([fc1(x)[at:at + step] for x in xs])
                    out.append((lay + X + "linear_fc1.weight", [L, E, 2 * Fe, H],
                                [g, e * le, (half * ETP + t) * step, 0], block[None],
                                ("expert", t, e)))
            for t in range(ETP):
                block = torch.stack([fc2(x)[:, t * step:(t + 1) * step] for x in xs])
                out.append((lay + X + "linear_fc2.weight", [L, E, H, Fe],
                            [g, e * le, 0, t * step], block.contiguous()[None], ("expert", t, e)))
    else:
        for x in range(E):
            tp_rows(X + "linear_fc1.weight", fc1(x), ETP, owner(x), glu=True, lead=(x,))
        for x in range(E):
            tp_cols(X + "linear_fc2.weight", fc2(x), ETP, owner(x), lead=(x,))
    if S:
        Sx = "mlp.shared_experts."
        if cfg.shared_gate:
            add(Sx + "gate_weight", [1, H], [0, 0], bf(f"{g}.shared_gate", (1, H)), ("dense", 0))
        tp_rows(Sx + "linear_fc1.weight", torch.cat([bf(f"{g}.shared.fc1.gate", (S, H)),
                                                     bf(f"{g}.shared.fc1.up", (S, H))]), glu=True)
        tp_cols(Sx + "linear_fc2.weight", bf(f"{g}.shared.fc2", (H, S)))
    return out


def extra_states(cfg, EP, g):
    """Layer g's Transformer Engine extra states, [(name, holder)] with the layer axis (an empty
    uint8 tensor each: no fp8)."""
    E, le = cfg.num_experts, cfg.num_experts // EP
    L = cfg.num_layers
    out = [(f"decoder.layers.self_attention.{m}._extra_state/shard_{g}_{L}", ("dense", 0))
           for m in ("core_attention", "linear_proj", "linear_qkv")]
    if not cfg.moe_layer(g):
        return out + [(f"decoder.layers.mlp.{m}._extra_state/shard_{g}_{L}", ("dense", 0))
                      for m in ("linear_fc1", "linear_fc2")]
    for m in ("linear_fc1", "linear_fc2"):
        out += [(f"decoder.layers.mlp.experts.experts.{m}._extra_state/shard_{g}.{x}_{L}.{E}",
                 ("expert", 0, x // le)) for x in range(E)]
    if cfg.shared_size:
        out += [(f"decoder.layers.mlp.shared_experts.{m}._extra_state/shard_{g}_{L}",
                 ("dense", 0)) for m in ("linear_fc1", "linear_fc2")]
    return out


def unstack(key, shape, offsets, chunk, g):
    """[BLOCK] a layer's tensor item under decoder.layers.{g}. without the layer axis."""
    pre = "decoder.layers."
    return f"{pre}{g}.{key[len(pre):]}", shape[1:], offsets[1:], chunk[0].clone()


def unstack_object(name, g):
    """[BLOCK] a layer's object name likewise: its offsets lose the layer's."""
    pre = "decoder.layers."
    key, shard = name.split("/shard_")
    offsets, shape = (x.split(".")[1:] for x in shard.split("_"))
    return f"{pre}{g}.{key[len(pre):]}/shard_{'.'.join(offsets or ['0'])}_{'.'.join(shape or ['1'])}"


def model_items(cfg, v, T, P, EP, ETP, p):
    """Stage p's tensor items [(key, global shape, offsets, chunk), holder] and its objects'
    [(name, holder)], in state-dict order."""
    H, V, L = cfg.hidden_size, cfg.padded_vocab(T), cfg.num_layers
    bf = lambda name, shape: v.get(name, "master", shape).to(torch.bfloat16)  # noqa: E731
    vocab = lambda name, t: bf(name, (v.vocab_rows, H))[t * V // T:(t + 1) * V // T].clone()  # noqa
    items, objs = [], []
    if p == 0:
        items += [(("embedding.word_embeddings.weight", [V, H], [t * V // T, 0], vocab("word", t)),
                   ("dense", t)) for t in range(T)]
    per = L // P
    for g in range(p * per, (p + 1) * per):
        for key, shape, offsets, chunk, holder in layer_items(cfg, v, T, ETP, EP, g):
            item = (key, shape, offsets, chunk)
            items.append((unstack(*item, g) if per_layer(cfg) else item, holder))
        objs += [(unstack_object(name, g) if per_layer(cfg) else name, holder)
                 for name, holder in extra_states(cfg, EP, g)]
    if p == P - 1:
        items.append((("decoder.final_layernorm.weight", [H], [0], bf("final_norm", (H,))),
                      ("dense", 0)))
        if cfg.untie:
            items += [(("output_layer.weight", [V, H], [t * V // T, 0], vocab("out", t)),
                       ("dense", t)) for t in range(T)]
    return items, objs


def write_checkpoint(root, cfg, T, P, EP, ETP=None, iteration=100, common_in_dcp=False):
    """Writes cfg's model (a megatron_moe_fixture.MoeConfig) as torch_dist at TP x PP x EP with
    expert TP ETP (default TP) under ROOT, and the tracker; returns (DP, EDP)."""
    ETP = ETP or T
    if cfg.form == "grouped" and ETP != T:
        raise ValueError("the legacy GroupedMLP cut its experts by TP")
    DP, EDP = data_parallel(T, EP, ETP)
    W = T * DP  # ranks per pipeline stage
    v = mm.Values(cfg)
    tensors = {r: [] for r in range(W * P)}
    objs = {r: [] for r in range(W * P)}
    load = {r: 0 for r in range(W * P)}
    for p in range(P):
        dense = lambda t: [p * W + t + T * d for d in range(DP)]  # noqa: E731
        expert = lambda et, e: p * W + et + ETP * e  # noqa: E731  (expert-DP rank 0)
        items, names = model_items(cfg, v, T, P, EP, ETP, p)
        # [PARALLEL] the experts' holders first, then each dense tensor, largest first, to the
        # least loaded DP rank holding it; each rank's items stay in state-dict order.
        order = sorted(range(len(items)), key=lambda i: (items[i][1][0] == "dense",
                                                         -items[i][0][3].numel(), i))
        chosen = {}
        for i in order:
            (_, _, _, chunk), holder = items[i]
            r = (min(dense(holder[1]), key=lambda r: (load[r], r)) if holder[0] == "dense"
                 else expert(holder[1], holder[2]))
            chosen[i] = r
            load[r] += chunk.numel() * chunk.element_size()
        for i, (item, _) in enumerate(items):
            tensors[chosen[i]].append(item)
        for name, holder in names:
            r = dense(0)[0] if holder[0] == "dense" else expert(holder[1], holder[2])
            objs[r].append((name, [torch.empty(0, dtype=torch.uint8)]))
        for t in range(T):
            objs[dense(t)[0]].append(
                (f"rng_state/shard_{p}.{t}_{P}.{T}", [mm.mf._rng_state(cfg.seed + t + T * p)]))
    ranks = [(r, objs[r], tensors[r]) for r in range(W * P)]
    tdf.write_iteration(root, iteration, ranks, common_state(cfg, T, P, EP, ETP, DP, iteration),
                        common_in_dcp)
    return DP, EDP


def common_state(cfg, T, P, EP, ETP, DP, iteration):
    args = mm.make_args(dataclasses.replace(cfg, data_parallel_size=DP), T, P, EP, iteration)
    args.ckpt_format = "torch_dist"
    args.expert_tensor_parallel_size = ETP
    args.moe_use_legacy_grouped_gemm = cfg.form == "grouped"
    for k, x in cfg.extra_args.items():
        setattr(args, k, x)
    return {"args": args, "checkpoint_version": 3.0, "iteration": iteration,
            "num_floating_point_operations_so_far": 0, "content_metadata": {}}


def global_tensors(cfg, T):
    """{key: tensor} of every ShardedTensor at its global shape (the vocabulary padded for TP T),
    assembled from the model's values (not from the chunks written): what a consolidated view
    must hold."""
    out = {}
    for (key, shape, offsets, chunk), _ in model_items(cfg, mm.Values(cfg), T, 1, 1, 1, 0)[0]:
        whole = out.setdefault(key, torch.zeros(shape, dtype=chunk.dtype))
        whole[tuple(slice(o, o + n) for o, n in zip(offsets, chunk.shape))] = chunk
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--etp", type=int, default=None)
    ap.add_argument("--iteration", type=int, default=100)
    ap.add_argument("--config", default="{}", help="MoeConfig fields as JSON")
    ap.add_argument("--common-in-dcp", action="store_true")
    a = ap.parse_args(argv)
    write_checkpoint(a.root, mm.MoeConfig(**json.loads(a.config)), a.tp, a.pp, a.ep, a.etp,
                     a.iteration, a.common_in_dcp)


if __name__ == "__main__":
    main()
