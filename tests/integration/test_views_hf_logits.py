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
from test_views_hf import LLAMA, load_view  # noqa: E402


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


def attend(q, k, v):
    """Causal attention: q [s, heads, d], k and v [s, heads, d]."""
    s, _, d = q.shape
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(s, -1)


def hf_forward(sd, config, tokens):
    """LlamaForCausalLM's forward over HF-named tensors (float64)."""
    f = {k: v.double() for k, v in sd.items()}
    heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
    d, eps, theta = config["head_dim"], config["rms_norm_eps"], config["rope_theta"]
    x = f["model.embed_tokens.weight"][tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, f[p + "input_layernorm.weight"], eps)
        s = h.shape[0]
        q = rope((h @ f[p + "self_attn.q_proj.weight"].T).view(s, heads, d), theta)
        k = rope((h @ f[p + "self_attn.k_proj.weight"].T).view(s, groups, d), theta)
        v = (h @ f[p + "self_attn.v_proj.weight"].T).view(s, groups, d)
        rep = heads // groups  # repeat_kv: key/value head g serves query heads g*rep .. g*rep+rep-1
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        x = x + attend(q, k, v) @ f[p + "self_attn.o_proj.weight"].T
        h = rms(x, f[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ f[p + "mlp.gate_proj.weight"].T, h @ f[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ f[p + "mlp.down_proj.weight"].T
    x = rms(x, f["model.norm.weight"], eps)
    head = f["lm_head.weight"] if "lm_head.weight" in f else f["model.embed_tokens.weight"]
    return x @ head.T


def megatron_forward(root, cfg, T, P, tokens):
    """The forward pass as megatron.core computes it, from the rank files (float64): TP shards
    joined along the dimension ColumnParallel/RowParallelLinear cut, each rank's fc1 its
    [gate; up] halves, the fused QKV viewed [groups, (heads/groups + 2) * head_dim]."""
    ranks = {(t, p): torch.load(root / "iter_0000100" / mf.rank_name(t, p, P) / mf.FILE)["model"]
             for t in range(T) for p in range(P)}
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
            mixed = (h @ cat(pre + "self_attention.linear_qkv.weight", p, 0).T).view(s, g, -1)
            q = mixed[..., : qh * d].reshape(s, g * qh, d)
            k = mixed[..., qh * d:(qh + 1) * d]
            v = mixed[..., (qh + 1) * d:]
            q, k = rope(q, theta), rope(k, theta)
            k, v = k.repeat_interleave(qh, dim=1), v.repeat_interleave(qh, dim=1)
            x = x + attend(q, k, v) @ cat(pre + "self_attention.linear_proj.weight", p, 1).T
            h = rms(x, ranks[(0, p)][pre + "pre_mlp_layernorm.weight"].double(), eps)
            fc1 = [ranks[(t, p)][pre + "mlp.linear_fc1.weight"].double() for t in range(T)]
            inter = torch.cat([h @ w.T for w in fc1], dim=-1)  # per rank: [gate_r, up_r]
            parts = [c.chunk(2, dim=-1) for c in inter.split(2 * cfg.ffn_hidden_size // T, -1)]
            gate = torch.cat([a for a, _ in parts], dim=-1)
            up = torch.cat([b for _, b in parts], dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ cat(
                pre + "mlp.linear_fc2.weight", p, 1).T
    x = rms(x, ranks[(0, P - 1)]["decoder.final_layernorm.weight"].double(), eps)
    head = cat("output_layer.weight", P - 1, 0) if cfg.untie else emb
    return (x @ head.T)[:, : cfg.vocab_size]  # the padded rows are not the tokenizer's


@pytest.mark.parametrize("untie,groups,shape", [(True, 4, (2, 2)), (False, 2, (4, 1))])
def test_hf_view_logits_equal_megatrons(mnt, untie, groups, shape):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=untie, num_query_groups=groups, **LLAMA)
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
