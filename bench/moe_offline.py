"""The offline route for bench_reshard.py's mixture-of-experts figures: what a conversion script
does with a Megatron-LM legacy MoE checkpoint (tests/reshard/megatron_moe_fixture.py's layout:
per-rank model_optim_rng.pt, SequentialMLP experts, the fp16 optimizer's fp32 masters and Adam
state, a ChainedOptimizer [dense, experts] when EP > 1), computed from the source files alone.

  convert_ep  tpTs-ppP-epEs -> tpT-ppP-epE at the same PP: torch.load of every source rank file
              of a stage, each parameter's weight, master, exp_avg and exp_avg_sq merged across
              TP by its rule (megatron_fixture.rule_of; the router replicated), the experts
              renumbered globally (local expert k of EP rank e is e * E/EP + k), split again for
              the target, the optimizer laid out again (megatron_moe_fixture._optimizer:
              positions in model order, groups by weight-decay class), torch.save of the target
              rank files
  convert_hf  every source rank file to MixtralForCausalLM's names, one safetensors file under
              save_pretrained's 5 GB, its index and config.json

compare_ep and compare_hf check that a view and the conversion made the same thing.
"""
import collections
import copy
import json
import os
import re
import struct
from pathlib import Path

import torch

import megatron_fixture as mf
import megatron_moe_fixture as mm

ITER = "iter_0000100"
EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)\.(.*)$")


def _is_param(name, x):
    """A model entry with optimizer state (not _extra_state, not the router's bias buffer)."""
    return torch.is_tensor(x) and x.dtype != torch.uint8 and not name.endswith(".expert_bias")


def rank_state(sd, ep):
    """{name: (weight, master, exp_avg, exp_avg_sq)} of one rank file. Each sub-optimizer holds
    its parameters (the experts' at EP > 1, the rest) in model order, grouped by weight-decay
    class in order of first appearance; a parameter's state is found by its position there."""
    model = sd["model"]
    params = [n for n, x in model.items() if _is_param(n, x)]
    is_expert = lambda n: ep > 1 and EXPERT.match(n) is not None  # noqa: E731
    opts = sd["optimizer"] if isinstance(sd["optimizer"], list) else [sd["optimizer"]]
    owners = [[n for n in params if not is_expert(n)], [n for n in params if is_expert(n)]]
    out = {}
    for names, opt in zip(owners, opts):
        groups = collections.OrderedDict()
        for n in names:
            groups.setdefault(mf._no_wd(n, model[n]), []).append(n)
        state, pgs = opt["optimizer"]["state"], opt["optimizer"]["param_groups"]
        assert [len(g["params"]) for g in pgs] == [len(x) for x in groups.values()]
        for g, (no_wd, members), masters in zip(pgs, groups.items(), opt["fp32_from_fp16_params"]):
            assert g["wd_mult"] == (0.0 if no_wd else 1.0)
            for n, idx, m in zip(members, g["params"], masters):
                assert m.shape == model[n].shape, n
                out[n] = (model[n], m, state[idx]["exp_avg"], state[idx]["exp_avg_sq"])
    assert len(out) == len(params)
    return out


def _rule(name, swiglu):
    """megatron_fixture.rule_of, and the router's weight (replicated across TP)."""
    return "replicated" if name.endswith(".mlp.router.weight") else mf.rule_of(name, swiglu)


def _global(name, e, le):
    m = EXPERT.match(name)
    return name if m is None else f"{m[1]}{e * le + int(m[2])}.{m[3]}"


def _target_keys(keys, first, count):
    """[(target key, global key, source key)] of a target rank: the primary source rank's keys,
    each expert block rewritten with `count` local experts from global expert `first` (each with
    local expert 0's entries, in order)."""
    out, done = [], set()
    for k in keys:
        m = EXPERT.match(k)
        if m is None:
            out.append((k, k, k))
        elif m[1] not in done:
            done.add(m[1])
            sufs = [EXPERT.match(x)[3] for x in keys if x.startswith(m[1] + "0.")]
            out += [(f"{m[1]}{j}.{s}", f"{m[1]}{first + j}.{s}", f"{m[1]}0.{s}")
                    for j in range(count) for s in sufs]
    return out


def _shard(rule, x, T, t, rows):
    if T == 1 and (rule != "vocab" or x.shape[0] == rows):
        return x  # already the whole tensor, in its own storage
    return mf.split_full(rule, x, T, t, rows)


def convert_ep(src, out, Ts, P, EPs, T, EPt):
    """src/ITER at TP Ts x PP P x EP EPs -> out/ITER at TP T x PP P x EP EPt (see the docstring)."""
    for p in range(P):
        files = {(t, e): torch.load(src / ITER / mm.rank_name(t, p, e, P, EPs) / mm.FILE)
                 for e in range(EPs) for t in range(Ts)}
        args = files[(0, 0)]["args"]
        les, let = args.num_experts // EPs, args.num_experts // EPt
        m = args.make_vocab_size_divisible_by * T
        rows = (args.vocab_size + m - 1) // m * m
        full = {}  # global name: (weight, master, exp_avg, exp_avg_sq), TP shards joined
        for e in range(EPs):
            states = [rank_state(files[(t, e)], EPs) for t in range(Ts)]
            for n in states[0]:
                if e and not EXPERT.match(n):
                    continue  # the dense parameters: the same on every EP rank
                rule = _rule(n, args.swiglu)
                full[_global(n, e, les)] = tuple(mf.join_shards(rule, [s[n][k] for s in states])
                                                 for k in range(4))
        for e in range(EPt):
            for t in range(T):
                prim = files[(t * Ts // T, e * EPs // EPt)]
                items, dense, experts = [], [], []
                for tk, gk, sk in _target_keys(list(prim["model"]), e * let, let):
                    if gk not in full:
                        items.append((tk, prim["model"][sk]))
                        continue
                    rule = _rule(gk, args.swiglu)
                    w, *st = (_shard(rule, x, T, t, rows) for x in full[gk])
                    items.append((tk, w))
                    (experts if EPt > 1 and EXPERT.match(tk) else dense).append((tk, *st))
                sd = dict(prim)
                sd["model"] = mf._state_dict(items)
                a = sd["args"] = copy.copy(args)
                a.tensor_model_parallel_size = a.expert_tensor_parallel_size = T
                a.expert_model_parallel_size = EPt
                a.padded_vocab_size = rows
                a.world_size = T * P * a.data_parallel_size
                sd["optimizer"] = mm._optimizer(dense, False, prim["iteration"])
                if experts:
                    sd["optimizer"] = [sd["optimizer"],
                                       mm._optimizer(experts, True, prim["iteration"])]
                d = out / ITER / mm.rank_name(t, p, e, P, EPt)
                d.mkdir(parents=True, exist_ok=True)
                torch.save(sd, d / mm.FILE)
        del files, full
    (out / mm.TRACKER).write_text("100")


def mixtral_config(args):
    """config.json of MixtralForCausalLM from Megatron's args."""
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": args.hidden_size, "intermediate_size": args.moe_ffn_hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_query_groups, "head_dim": args.kv_channels,
        "hidden_act": "silu", "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": args.norm_epsilon, "rope_theta": float(args.rotary_base),
        "rope_scaling": None, "vocab_size": args.vocab_size,
        "tie_word_embeddings": not args.untie_embeddings_and_output_weights,
        "sliding_window": None, "num_local_experts": args.num_experts,
        "num_experts_per_tok": args.moe_router_topk, "output_router_logits": False,
        "router_aux_loss_coef": args.moe_aux_loss_coeff, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True}


def convert_hf(src, out, Ts, P, EPs, write_hf_dir):
    """Every rank file under src/ITER -> out: MixtralForCausalLM's names (QKV split per query
    group, each expert's fc1 into w1 (gate) and w3 (up), fc2 as w2, the vocabulary unpadded)."""
    files = {(t, p, e): torch.load(src / ITER / mm.rank_name(t, p, e, P, EPs) / mm.FILE)
             for p in range(P) for e in range(EPs) for t in range(Ts)}
    args = files[(0, 0, 0)]["args"]
    ranks = {k: f["model"] for k, f in files.items()}
    H, V, le = args.hidden_size, args.vocab_size, args.num_experts // EPs
    g, hd = args.num_query_groups, args.kv_channels
    qh = args.num_attention_heads // g
    per = args.num_layers // P

    def cat(key, p, dim, e=0):
        return torch.cat([ranks[(t, p, e)][key] for t in range(Ts)], dim)
    sd = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0, 0)[:V]}
    for p in range(P):
        for i in range(per):
            pre, hf = f"decoder.layers.{i}.", f"model.layers.{p * per + i}."
            qkv = cat(pre + "self_attention.linear_qkv.weight", p, 0).view(g, (qh + 2) * hd, -1)
            sd[hf + "input_layernorm.weight"] = ranks[(0, p, 0)][pre + "input_layernorm.weight"]
            sd[hf + "self_attn.q_proj.weight"] = qkv[:, :qh * hd].reshape(-1, H)
            sd[hf + "self_attn.k_proj.weight"] = qkv[:, qh * hd:(qh + 1) * hd].reshape(-1, H)
            sd[hf + "self_attn.v_proj.weight"] = qkv[:, (qh + 1) * hd:].reshape(-1, H)
            sd[hf + "self_attn.o_proj.weight"] = cat(pre + "self_attention.linear_proj.weight",
                                                     p, 1)
            sd[hf + "post_attention_layernorm.weight"] = \
                ranks[(0, p, 0)][pre + "pre_mlp_layernorm.weight"]
            moe = hf + "block_sparse_moe."
            sd[moe + "gate.weight"] = ranks[(0, p, 0)][pre + "mlp.router.weight"]
            for e in range(EPs):
                for k in range(le):
                    x = pre + f"mlp.experts.local_experts.{k}."
                    halves = [ranks[(t, p, e)][x + "linear_fc1.weight"].chunk(2)
                              for t in range(Ts)]
                    ex = moe + f"experts.{e * le + k}."
                    sd[ex + "w1.weight"] = torch.cat([h[0] for h in halves])
                    sd[ex + "w2.weight"] = cat(x + "linear_fc2.weight", p, 1, e)
                    sd[ex + "w3.weight"] = torch.cat([h[1] for h in halves])
    sd["model.norm.weight"] = ranks[(0, P - 1, 0)]["decoder.final_layernorm.weight"]
    sd["lm_head.weight"] = cat("output_layer.weight", P - 1, 0)[:V]
    write_hf_dir(out, sd)
    (out / "config.json").write_text(json.dumps(mixtral_config(args), indent=2))
    os.sync()


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(mf._bits(a), mf._bits(b))


def compare_ep(view, off, P, EP, T=1):
    """Every rank file of the two iteration directories: the model's keys and tensors, bit for
    bit, and each sub-optimizer's groups, masters, exp_avg and exp_avg_sq."""
    for p in range(P):
        for e in range(EP):
            for t in range(T):
                name = mm.rank_name(t, p, e, P, EP)
                a, b = torch.load(view / name / mm.FILE), torch.load(off / name / mm.FILE)
                assert list(a["model"]) == list(b["model"]), name
                for k, x in a["model"].items():
                    assert (x is None and b["model"][k] is None) or _same(x, b["model"][k]), k
                oa, ob = a["optimizer"], b["optimizer"]
                assert type(oa) is type(ob) and len(oa) == len(ob), name
                for sa, sb in zip(oa, ob) if isinstance(oa, list) else [(oa, ob)]:
                    ga, gb = sa["optimizer"]["param_groups"], sb["optimizer"]["param_groups"]
                    assert [x["params"] for x in ga] == [x["params"] for x in gb], name
                    for ma, mb in zip(sa["fp32_from_fp16_params"], sb["fp32_from_fp16_params"]):
                        assert all(_same(x, y) for x, y in zip(ma, mb)) and len(ma) == len(mb)
                    for i, st in sa["optimizer"]["state"].items():
                        for k in ("exp_avg", "exp_avg_sq"):
                            assert _same(st[k], sb["optimizer"]["state"][i][k]), (name, i, k)


def read_safetensors(path):
    data = bytearray(Path(path).read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    raw = torch.frombuffer(data, dtype=torch.uint8)[8 + n:]
    kinds = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    return {k: raw[v["data_offsets"][0]:v["data_offsets"][1]].view(kinds[v["dtype"]])
            .reshape(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def compare_hf(view, off):
    """config.json equal; every tensor of the two directories (through their indexes) bit for
    bit."""
    assert json.loads((view / "config.json").read_text()) == \
        json.loads((off / "config.json").read_text())

    def load(d):
        index = json.loads((d / "model.safetensors.index.json").read_text())
        sd = {}
        for f in sorted(set(index["weight_map"].values())):
            sd.update(read_safetensors(d / f))
        assert sorted(sd) == sorted(index["weight_map"])
        return index, sd
    (ia, a), (ib, b) = load(view), load(off)
    assert ia["metadata"]["total_size"] == ib["metadata"]["total_size"]
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))[:8]
    for k in a:
        assert _same(a[k], b[k]), k
    return len(a)
