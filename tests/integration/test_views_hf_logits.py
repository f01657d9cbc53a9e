# The hf view computes the same function as the Megatron checkpoint it comes from: logits of a
# Llama forward pass over the view's tensors, as transformers' LlamaForCausalLM computes it (HF's
# names, repeat_kv grouping, rotate_half RoPE, RMSNorm, SiLU(gate) * up), equal to round-off to
# those of a forward pass written here the way Megatron computes it from its own rank files (the
# fused QKV viewed per query group, SwiGLU's per-rank halves, TP shards joined as Megatron cuts
# them). Debian has no transformers; the GPU machine runs from_pretrained itself (issue 22).
import json
import math
import sys

import pytest
import torch

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
import megatron_fixture as mf  # noqa: E402
from test_views_hf import ARCHS, LLAMA, load_view  # noqa: E402


def rope(x, theta):
    """Rotary embedding, rotating halves (Megatron's default and HF Llama's): x [s, heads, d]."""
    s, _, d = x.shape
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attend(q, k, v, hidden=None):
    """Causal attention: q [s, heads, d], k and v [s, heads, d]; `hidden(q, k)` is True where
    query q may not see key k beyond causality (a sliding window)."""
    s, _, d = q.shape
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    if hidden is not None:
        pos = torch.arange(s)
        mask |= hidden(pos[:, None], pos[None, :])
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(s, -1)


def hf_dense_mlp(f, p, h):
    """LlamaMLP and its kin: down(SiLU(gate(h)) * up(h)), under `p` ("model.layers.N.mlp.")."""
    gate, up = h @ f[p + "gate_proj.weight"].T, h @ f[p + "up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ f[p + "down_proj.weight"].T


def hf_forward(sd, config, tokens, mlp=None):
    """The forward pass of config's architecture over HF-named tensors (float64), as
    transformers writes it: LlamaForCausalLM; MistralForCausalLM (a key is seen while
    kv > q - sliding_window, masking_utils' sliding_window_overlay); Qwen2ForCausalLM (biases on
    q, k and v); Qwen3ForCausalLM (q_norm and k_norm, RMSNorm over each head, before RoPE).
    `mlp(f, i, h)`, when given, is layer i's MLP block (the MoE architectures')."""
    f = {k: v.double() for k, v in sd.items()}
    heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or config["hidden_size"] // heads
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    window = (config.get("sliding_window") if config["model_type"] in ("mistral", "mixtral")
              else None)
    hidden = (lambda q, k: ~(k > q - window)) if window else None
    x = f["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, f[p + "input_layernorm.weight"], eps)
        s = h.shape[0]
        proj = lambda c: h @ f[p + f"self_attn.{c}_proj.weight"].T + f.get(  # noqa: E731
            p + f"self_attn.{c}_proj.bias", 0)
        q, k, v = proj("q").view(s, heads, d), proj("k").view(s, groups, d), proj("v").view(s, groups, d)
        if p + "self_attn.q_norm.weight" in f:
            q, k = rms(q, f[p + "self_attn.q_norm.weight"], eps), rms(k, f[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, theta), rope(k, theta)
        rep = heads // groups  # repeat_kv: key/value head g serves query heads g*rep .. g*rep+rep-1
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        x = x + attend(q, k, v, hidden) @ f[p + "self_attn.o_proj.weight"].T
        h = rms(x, f[p + "post_attention_layernorm.weight"], eps)
        x = x + (mlp(f, i, h) if mlp else hf_dense_mlp(f, p + "mlp.", h))
    x = rms(x, f["model.norm.weight"], eps)
    head = f["lm_head.weight"] if "lm_head.weight" in f else f["model.embed_tokens.weight"]
    return x @ head.T


def megatron_dense_mlp(cat, p, pre, h, T, ffn):
    """megatron.core's MLP on stage p: each TP rank's fc1 its [gate; up] halves, fc2 row-parallel.
    `cat(key, p, dim)` joins a tensor's TP shards."""
    inter = h @ cat(pre + "linear_fc1.weight", p, 0).T  # per rank: [gate_r, up_r]
    parts = [c.chunk(2, dim=-1) for c in inter.split(2 * ffn // T, -1)]
    gate = torch.cat([a for a, _ in parts], dim=-1)
    up = torch.cat([b for _, b in parts], dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ cat(pre + "linear_fc2.weight", p, 1).T


def megatron_forward(root, cfg, T, P, tokens, ranks=None, mlp=None):
    """The forward pass as megatron.core computes it, from the rank files (float64): TP shards
    joined along the dimension ColumnParallel/RowParallelLinear cut, each rank's fc1 its
    [gate; up] halves, the fused QKV (and its bias) viewed [groups, (heads/groups + 2) *
    head_dim]; q_layernorm/k_layernorm over each head before the rotary embedding; a window
    (left, 0) as Transformer Engine applies it: keys q - left .. q. `ranks` {(t, p): model state
    dict} when given (else read from root); `mlp(cat, p, i, h)` stage p's local layer i's MLP
    block when given."""
    if ranks is None:
        ranks = {(t, p): torch.load(root / "iter_0000100" / mf.rank_name(t, p, P) / mf.FILE)[
            "model"] for t in range(T) for p in range(P)}
    per, h_, d = cfg.num_layers // P, cfg.hidden_size, cfg.head_dim
    g, qh = cfg.groups, cfg.num_attention_heads // cfg.groups
    eps, theta = 1e-5, 10000.0
    cat = lambda key, p, dim: torch.cat([ranks[(t, p)][key] for t in range(T)], dim).double()  # noqa
    emb = cat("embedding.word_embeddings.weight", 0, 0)
    x = emb[tokens]
    s = x.shape[0]
    for p in range(P):
        for i in range(per):
            pre = f"decoder.layers.{i}."
            h = rms(x, ranks[(0, p)][pre + "input_layernorm.weight"].double(), eps)
            mixed = h @ cat(pre + "self_attention.linear_qkv.weight", p, 0).T
            if cfg.qkv_bias:
                mixed = mixed + cat(pre + "self_attention.linear_qkv.bias", p, 0)
            mixed = mixed.view(s, g, -1)
            q = mixed[..., : qh * d].reshape(s, g * qh, d)
            k = mixed[..., qh * d:(qh + 1) * d]
            v = mixed[..., (qh + 1) * d:]
            if cfg.qk_layernorm:
                q = rms(q, ranks[(0, p)][pre + "self_attention.q_layernorm.weight"].double(), eps)
                k = rms(k, ranks[(0, p)][pre + "self_attention.k_layernorm.weight"].double(), eps)
            q, k = rope(q, theta), rope(k, theta)
            k, v = k.repeat_interleave(qh, dim=1), v.repeat_interleave(qh, dim=1)
            hidden = None
            if cfg.window_size:
                hidden = lambda qi, ki: ki < qi - cfg.window_size[0]  # noqa: E731
            x = x + attend(q, k, v, hidden) @ cat(pre + "self_attention.linear_proj.weight", p, 1).T
            h = rms(x, ranks[(0, p)][pre + "pre_mlp_layernorm.weight"].double(), eps)
            x = x + (mlp(cat, p, i, h) if mlp else
                     megatron_dense_mlp(cat, p, pre + "mlp.", h, T, cfg.ffn_hidden_size))
    x = rms(x, ranks[(0, P - 1)]["decoder.final_layernorm.weight"].double(), eps)
    head = cat("output_layer.weight", P - 1, 0) if cfg.untie else emb
    return (x @ head.T)[:, : cfg.vocab_size]  # the padded rows are not the tokenizer's


@pytest.mark.parametrize("arch,untie,groups,shape", [
    ("llama", True, 4, (2, 2)), ("llama", False, 2, (4, 1)), ("mistral", True, 2, (2, 2)),
    ("qwen2", False, 2, (2, 1)), ("qwen3", True, 2, (2, 2))])
def test_hf_view_logits_equal_megatrons(mnt, arch, untie, groups, shape):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=untie, num_query_groups=groups, **ARCHS[arch][1])
    mf.save_checkpoint(root, cfg, *shape)
    sd, _ = load_view(root / ".views" / "hf")
    config = json.loads((root / ".views" / "hf" / "config.json").read_text())
    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(5))
    got = hf_forward(sd, config, tokens)
    want = megatron_forward(root, cfg, *shape, tokens)
    assert got.shape == want.shape == (12, cfg.vocab_size)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), (got - want).abs().max()
    # A wrong grouping is not within round-off: the test can tell.
    wrong = dict(sd)
    k = "model.layers.0.self_attn.k_proj.weight"
    wrong[k] = sd[k].view(groups, cfg.head_dim, -1).flip(0).reshape(sd[k].shape)
    assert not torch.allclose(hf_forward(wrong, config, tokens), want, rtol=1e-6, atol=1e-6)
    # What tells the architectures apart is checked too: each is not within round-off when left out.
    if arch == "mistral":  # a window one key narrower
        narrow = dict(config, sliding_window=config["sliding_window"] - 1)
        assert not torch.allclose(hf_forward(sd, narrow, tokens), want, rtol=1e-6, atol=1e-6)
    if arch == "qwen2":  # the q, k and v biases
        plain = {n: t for n, t in sd.items() if not n.endswith("_proj.bias")}
        assert not torch.allclose(hf_forward(plain, config, tokens), want, rtol=1e-6, atol=1e-6)
    if arch == "qwen3":  # q_norm and k_norm swapped
        swapped = dict(sd)
        for i in range(config["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn."
            swapped[p + "q_norm.weight"], swapped[p + "k_norm.weight"] = (
                sd[p + "k_norm.weight"], sd[p + "q_norm.weight"])
        assert not torch.allclose(hf_forward(swapped, config, tokens), want, rtol=1e-6, atol=1e-6)
