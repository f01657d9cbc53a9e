# The hf view of Megatron-LM mixture-of-experts checkpoints (docs/views.md, "Which architecture"):
# MixtralForCausalLM, Qwen3MoeForCausalLM and Qwen2MoeForCausalLM through a real mount, for
# sources written by tests/reshard/megatron_moe_fixture.py in Megatron's layout (TP x PP x EP rank
# files, SequentialMLP and TEGroupedMLP experts). Checked two ways, neither through the view's
# code: every tensor against the fixture's full model under the Hub's names, and the logits of a
# float64 forward pass written to each architecture's semantics (transformers' sparse MoE blocks:
# softmax over the experts, top k, renormalised when norm_topk_prob, Qwen2-MoE's sigmoid-gated
# shared expert) against one written the way megatron.core computes it from the rank files
# (its router's top k over the logits then a softmax over the k, or pre_softmax; the experts' TP
# shards; EP rank e holding experts e * E/EP ..). Runs in /usr/bin/python3.
import errno
import json
import os
import sys

import pytest
import torch

from conftest import REPO_ROOT, expect_errno, read_file

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
import megatron_moe_fixture as mm  # noqa: E402
from test_views_hf import load_view  # noqa: E402
from test_views_hf_logits import hf_dense_mlp, hf_forward, megatron_dense_mlp, megatron_forward  # noqa: E402,E501

# (fixture config, source (TP, PP, EP), HF class, model_type)
CASES = {
    "mixtral-sequential-tp2pp2ep2": (dict(form="sequential"), (2, 2, 2),
                                     "MixtralForCausalLM", "mixtral"),
    "mixtral-te-tied-ep4": (dict(form="te", untie=False, topk=1), (1, 1, 4),
                            "MixtralForCausalLM", "mixtral"),
    "qwen3moe-te-mixed-tp2ep4": (dict(form="te", qk_layernorm=True, layer_freq=[1, 0, 1, 1]),
                                 (2, 1, 4), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "qwen3moe-presoftmax-pp2ep2": (dict(form="sequential", qk_layernorm=True, pre_softmax=True),
                                   (1, 2, 2), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "qwen2moe-shared-mixed-tp2pp2ep2": (dict(form="sequential", qkv_bias=True, shared_size=32,
                                             shared_gate=True, layer_freq=[0, 1, 1, 1],
                                             untie=False), (2, 2, 2),
                                        "Qwen2MoeForCausalLM", "qwen2_moe"),
}


def expected(cfg, arch):
    """The HF state dict of the fixture's model (bf16, as the rank files hold it), under the Hub
    names of `arch`, from the fixture's full-model values."""
    v = mm.Values(cfg)
    bf = lambda name, shape: v.get(name, "master", shape).to(torch.bfloat16)  # noqa: E731
    H, F, Fe, S, E = (cfg.hidden_size, cfg.ffn_hidden_size, cfg.moe_ffn_hidden_size,
                      cfg.shared_size, cfg.num_experts)
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups
    hd = H // heads
    word = bf("word", (v.vocab_rows, H))
    sd = {"model.embed_tokens.weight": word[:cfg.vocab_size]}
    for g in range(cfg.num_layers):
        p = f"model.layers.{g}."
        sd[p + "input_layernorm.weight"] = bf(f"{g}.in_norm", (H,))
        sd[p + "self_attn.q_proj.weight"] = bf(f"{g}.q", (heads * hd, H))
        sd[p + "self_attn.k_proj.weight"] = bf(f"{g}.k", (groups * hd, H))
        sd[p + "self_attn.v_proj.weight"] = bf(f"{g}.v", (groups * hd, H))
        if cfg.qkv_bias:
            sd[p + "self_attn.q_proj.bias"] = bf(f"{g}.q_bias", (heads * hd,))
            sd[p + "self_attn.k_proj.bias"] = bf(f"{g}.k_bias", (groups * hd,))
            sd[p + "self_attn.v_proj.bias"] = bf(f"{g}.v_bias", (groups * hd,))
        if cfg.qk_layernorm:
            sd[p + "self_attn.q_norm.weight"] = bf(f"{g}.q_norm", (hd,))
            sd[p + "self_attn.k_norm.weight"] = bf(f"{g}.k_norm", (hd,))
        sd[p + "self_attn.o_proj.weight"] = bf(f"{g}.proj", (H, H))
        sd[p + "post_attention_layernorm.weight"] = bf(f"{g}.mlp_norm", (H,))
        if not cfg.moe_layer(g):
            sd[p + "mlp.gate_proj.weight"] = bf(f"{g}.fc1.gate", (F, H))
            sd[p + "mlp.up_proj.weight"] = bf(f"{g}.fc1.up", (F, H))
            sd[p + "mlp.down_proj.weight"] = bf(f"{g}.fc2", (H, F))
            continue
        moe = p + ("block_sparse_moe." if arch == "mixtral" else "mlp.")
        sd[moe + "gate.weight"] = bf(f"{g}.router", (E, H))
        names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for x in range(E):
            sd[moe + f"experts.{x}.{names[0]}.weight"] = bf(f"{g}.expert{x}.fc1.gate", (Fe, H))
            sd[moe + f"experts.{x}.{names[1]}.weight"] = bf(f"{g}.expert{x}.fc1.up", (Fe, H))
            sd[moe + f"experts.{x}.{names[2]}.weight"] = bf(f"{g}.expert{x}.fc2", (H, Fe))
        if S:
            sh = p + "mlp.shared_expert."
            sd[sh + "gate_proj.weight"] = bf(f"{g}.shared.fc1.gate", (S, H))
            sd[sh + "up_proj.weight"] = bf(f"{g}.shared.fc1.up", (S, H))
            sd[sh + "down_proj.weight"] = bf(f"{g}.shared.fc2", (H, S))
            sd[p + "mlp.shared_expert_gate.weight"] = bf(f"{g}.shared_gate", (1, H))
    sd["model.norm.weight"] = bf("final_norm", (H,))
    if cfg.untie:
        sd["lm_head.weight"] = bf("out", (v.vocab_rows, H))[:cfg.vocab_size]
    return sd


def route(logits, k, renormalise):
    """transformers' sparse MoE routing: softmax over every expert, the top k, renormalised when
    asked; the weights as a dense [tokens, E] matrix (0 where not chosen)."""
    probs = logits.softmax(-1)
    top, idx = probs.topk(k, dim=-1)
    if renormalise:
        top = top / top.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, idx, top)


def hf_moe_mlp(config):
    """Layer i's MLP block as MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock and
    Qwen2MoeSparseMoeBlock compute it (sparse when i is not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0; Mixtral's every layer)."""
    arch = config["model_type"]
    E = config.get("num_local_experts") or config["num_experts"]
    k = config["num_experts_per_tok"]
    norm = True if arch == "mixtral" else config["norm_topk_prob"]
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers", [])

    def mlp(f, i, h):
        p = f"model.layers.{i}."
        if arch != "mixtral" and (i in dense or (i + 1) % step != 0):
            return hf_dense_mlp(f, p + "mlp.", h)
        moe = p + ("block_sparse_moe." if arch == "mixtral" else "mlp.")
        w = route(h @ f[moe + "gate.weight"].T, k, norm)
        out = torch.zeros_like(h)
        for x in range(E):
            if arch == "mixtral":
                ex = moe + f"experts.{x}."
                y = (torch.nn.functional.silu(h @ f[ex + "w1.weight"].T) * (h @ f[ex + "w3.weight"].T)
                     ) @ f[ex + "w2.weight"].T
            else:
                y = hf_dense_mlp(f, moe + f"experts.{x}.", h)
            out = out + w[:, x:x + 1] * y
        if arch == "qwen2_moe":
            gate = torch.sigmoid(h @ f[p + "mlp.shared_expert_gate.weight"].T)
            out = out + gate * hf_dense_mlp(f, p + "mlp.shared_expert.", h)
        return out
    return mlp


def megatron_moe_forward(root, cfg, T, P, EP, tokens):
    """megatron.core's forward from the rank files: the dense part through megatron_forward
    (EP rank 0's files, which hold every dense tensor), each MoE layer as MoELayer computes it:
    TopKRouter (the top k of the logits then a softmax over those k; with pre_softmax a softmax
    over all then the top k), local expert j of EP rank e as global expert e * E/EP + j, its fc1
    and fc2 joined across TP like the dense MLP, the shared experts' output times
    sigmoid(h . gate_weight)."""
    it = root / "iter_0000100"
    load = lambda t, p, e: torch.load(it / mm.rank_name(t, p, e, P, EP) / mm.FILE)["model"]  # noqa
    files = {(t, p, e): load(t, p, e) for t in range(T) for p in range(P) for e in range(EP)}
    dense = cfg.as_dense_config()
    per, le, E = cfg.num_layers // P, cfg.num_experts // EP, cfg.num_experts

    def expert_key(pre, x, n):
        j = x % le
        if cfg.form == "sequential":
            return pre + f"mlp.experts.local_experts.{j}.linear_fc{n}.weight"
        return pre + f"mlp.experts.linear_fc{n}.weight{j}"

    def mlp(cat, p, i, h):
        pre = f"decoder.layers.{i}."
        if not cfg.moe_layer(p * per + i):
            return megatron_dense_mlp(cat, p, pre + "mlp.", h, T, cfg.ffn_hidden_size)
        logits = h @ files[(0, p, 0)][pre + "mlp.router.weight"].double().T
        if cfg.pre_softmax:
            top, idx = logits.softmax(-1).topk(cfg.topk, dim=-1)
        else:
            top, idx = logits.topk(cfg.topk, dim=-1)
            top = top.softmax(-1)
        w = torch.zeros_like(logits).scatter(-1, idx, top)
        out = torch.zeros_like(h)
        for x in range(E):
            e = x // le
            xcat = lambda key, p_, dim: torch.cat(  # noqa: E731
                [files[(t, p_, e)][key] for t in range(T)], dim).double()
            fc1 = expert_key(pre, x, 1)
            y = megatron_dense_mlp(lambda key, p_, dim: xcat(fc1 if key.endswith("fc1.weight")
                                                             else expert_key(pre, x, 2), p_, dim),
                                   p, "", h, T, cfg.moe_ffn_hidden_size)
            out = out + w[:, x:x + 1] * y
        if cfg.shared_size:
            y = megatron_dense_mlp(cat, p, pre + "mlp.shared_experts.", h, T, cfg.shared_size)
            if cfg.shared_gate:
                gw = files[(0, p, 0)][pre + "mlp.shared_experts.gate_weight"].double()
                y = y * torch.sigmoid(h @ gw.T)
            out = out + y
        return out

    ranks = {(t, p): files[(t, p, 0)] for t in range(T) for p in range(P)}
    return megatron_forward(root, dense, T, P, tokens, ranks=ranks, mlp=mlp)


def check_config(config, cfg, cls, arch):
    assert config["architectures"] == [cls] and config["model_type"] == arch
    assert config["num_experts_per_tok"] == cfg.topk
    assert config["hidden_size"] == cfg.hidden_size
    assert config["num_hidden_layers"] == cfg.num_layers
    assert config["vocab_size"] == cfg.vocab_size
    assert config["tie_word_embeddings"] == (not cfg.untie)
    dense = [g for g in range(cfg.num_layers) if not cfg.moe_layer(g)]
    if arch == "mixtral":
        assert config["num_local_experts"] == cfg.num_experts
        assert config["intermediate_size"] == cfg.moe_ffn_hidden_size
        assert config["sliding_window"] is None and config["router_jitter_noise"] == 0.0
        assert not dense
    else:
        assert config["num_experts"] == cfg.num_experts
        assert config["moe_intermediate_size"] == cfg.moe_ffn_hidden_size
        assert config["intermediate_size"] == cfg.ffn_hidden_size
        assert config["norm_topk_prob"] == (not cfg.pre_softmax)
        assert config["decoder_sparse_step"] == 1 and config["mlp_only_layers"] == dense
    if arch == "qwen2_moe":
        assert config["shared_expert_intermediate_size"] == cfg.shared_size
        assert config["qkv_bias"] is True
    assert config["router_aux_loss_coef"] == 0.01 and config["output_router_logits"] is False


@pytest.mark.parametrize("case", list(CASES))
def test_hf_view_of_an_moe_checkpoint(mnt, case):
    kw, shape, cls, arch = CASES[case]
    cfg = mm.MoeConfig(**kw)
    root = mnt / "ckpt"
    mm.save_checkpoint(root, cfg, *shape)
    assert "hf" in os.listdir(root / ".views")
    view = root / ".views" / "hf"
    got, _ = load_view(view)
    want = expected(cfg, arch)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), name
    config = json.loads(read_file(view / "config.json"))
    check_config(config, cfg, cls, arch)

    # The same function: logits of the view under the architecture's semantics equal megatron's.
    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    want_logits = megatron_moe_forward(root, cfg, *shape, tokens)
    mlp = hf_moe_mlp(config)
    got_logits = hf_forward(got, config, tokens, mlp=mlp)
    assert got_logits.shape == want_logits.shape == (12, cfg.vocab_size)
    assert torch.allclose(got_logits, want_logits, rtol=1e-9, atol=1e-9), (
        (got_logits - want_logits).abs().max())

    # What the comparison can tell: two experts swapped, the other normalisation, no shared gate.
    def differs(sd=got, conf=config):
        out = hf_forward(sd, conf, tokens, mlp=hf_moe_mlp(conf))
        return not torch.allclose(out, want_logits, rtol=1e-6, atol=1e-6)
    moe_layer = next(g for g in range(cfg.num_layers) if cfg.moe_layer(g))
    ex = f"model.layers.{moe_layer}." + ("block_sparse_moe" if arch == "mixtral" else "mlp")
    swapped = dict(got)
    for n in ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj"):
        a, b = f"{ex}.experts.1.{n}.weight", f"{ex}.experts.6.{n}.weight"
        swapped[a], swapped[b] = got[b], got[a]
    assert differs(sd=swapped)
    if arch != "mixtral" and cfg.topk > 1:
        assert differs(conf=dict(config, norm_topk_prob=not config["norm_topk_prob"]))
    if arch == "qwen2_moe":
        ungated = dict(got)
        for g in range(cfg.num_layers):
            key = f"model.layers.{g}.mlp.shared_expert_gate.weight"
            if key in got:
                ungated[key] = torch.full_like(got[key], 1e4)  # sigmoid = 1: no gate
        assert differs(sd=ungated)


def test_a_shifted_ep_numbering_is_caught(mnt):
    # A source whose EP ranks hold each other's experts (rank e the experts of rank e + 1): the
    # view follows Megatron's numbering, so its experts are not the model's, and both checks
    # see it.
    cfg = mm.MoeConfig(form="sequential", ep_shift=1)
    root = mnt / "ckpt"
    mm.save_checkpoint(root, cfg, 1, 1, 2)
    got, _ = load_view(root / ".views" / "hf")
    want = expected(mm.MoeConfig(form="sequential"), "mixtral")
    name = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    assert not torch.equal(got[name].view(torch.int16), want[name].view(torch.int16))
    assert torch.equal(got[name].view(torch.int16),
                       want["model.layers.0.block_sparse_moe.experts.4.w1.weight"].view(torch.int16))


REFUSED = [
    (dict(form="grouped"), "GroupedMLP stores every expert's weights transposed"),
    (dict(form="grouped", extra_args=dict(moe_use_legacy_grouped_gemm=None)),  # older args
     "GroupedMLP stores every expert's weights transposed"),
    (dict(extra_args=dict(moe_router_score_function="sigmoid")), "sigmoid"),
    (dict(expert_bias=True), "moe_router_enable_expert_bias"),
    (dict(extra_args=dict(moe_router_num_groups=2, moe_router_group_topk=1)), "group-limited"),
    (dict(extra_args=dict(moe_router_topk_scaling_factor=2.5)), "scaling"),
    (dict(extra_args=dict(moe_expert_capacity_factor=1.0)), "drops tokens"),
    (dict(extra_args=dict(moe_router_load_balancing_type="sinkhorn")), "sinkhorn"),
    (dict(extra_args=dict(moe_apply_probs_on_input=True)), "weighs the experts' inputs"),
    (dict(shared_size=32), "without args.moe_shared_expert_gate"),
    (dict(shared_size=32, shared_gate=True), "shared experts without QKV biases"),
    (dict(pre_softmax=True), "unnormalised"),
    (dict(layer_freq=[1, 0, 1, 0]), "MixtralForCausalLM has experts in every layer"),
    (dict(qkv_bias=True), "QKV biases but no gated shared expert"),
]


@pytest.mark.parametrize("kw,reason", REFUSED, ids=[r for _, r in REFUSED])
def test_hf_view_refuses_an_moe_model_no_architecture_expresses(mnt, kw, reason):
    root = mnt / "ckpt"
    mm.save_checkpoint(root, mm.MoeConfig(**kw), 1, 1, 2)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "hf")
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "hf: " in errors and reason in errors, errors
    names = os.listdir(root / ".views")
    assert "tp1-pp1-ep2" in names  # the Megatron views stay
    # Offered only where it can be made, as far as args tell (args of checkpoints older than
    # moe_use_legacy_grouped_gemm do not: refused on lookup).
    assert ("hf" in names) == ("moe_use_legacy_grouped_gemm" in kw.get("extra_args", {})), names
