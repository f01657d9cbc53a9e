# megatron.core's torch_dist checkpoints (dist_checkpointing on PyTorch DCP) through a real mount:
# written by tests/reshard/torch_dist_fixture.py in Megatron's layout (its docstring traces each
# fact to Megatron-LM's source), then recognized by `ckptfs inspect`, served whole by the DCP
# consolidated view of the iteration directory, and as a Hugging Face model by ROOT/.views/hf.
# The expected tensors are built from the fixture's full model, not from the chunks it wrote.
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import CKPTFS_BIN, REPO_ROOT, expect_errno, run

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402

FIXTURE = REPO_ROOT / "tests" / "reshard" / "torch_dist_fixture.py"
LLAMA = dict(era="mcore", swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
             bias=False)


def write(root, tp, pp, common_in_dcp=False, per_layer_keys=False, **kw):
    """The torch_dist checkpoint of ModelConfig(LLAMA + kw) at TP x PP, and that config."""
    flags = (["--common-in-dcp"] if common_in_dcp else []) + (
        ["--per-layer-keys"] if per_layer_keys else [])
    subprocess.run([sys.executable, str(FIXTURE), str(root), "--tp", str(tp), "--pp", str(pp),
                    "--config", json.dumps(kw)] + flags, check=True, timeout=300)
    return mf.ModelConfig(**{**LLAMA, **kw})


# The fixture's module registers stand-ins for torch's DCP classes: it runs in a child.
GLOBAL = ("import sys, json, torch; sys.path.insert(0, sys.argv[1]); import torch_dist_fixture as f, "
          "megatron_fixture as mf; cfg = mf.ModelConfig(**json.loads(sys.argv[2])); "
          "torch.save(f.global_tensors(mf.FullModel(cfg), int(sys.argv[3])), sys.argv[4])")


@pytest.fixture
def expected(workdir):
    """expected(kw, tp): {key: tensor} of the model at its global shapes, from its pieces."""
    def make(cfg_kw, tp):
        out = workdir / "expected.pt"
        subprocess.run([sys.executable, "-c", GLOBAL, str(REPO_ROOT / "tests" / "reshard"),
                        json.dumps({**LLAMA, **cfg_kw}), str(tp), str(out)], check=True,
                       timeout=300)
        return torch.load(out)
    return make


@pytest.mark.parametrize("kw,shape", [
    (dict(num_query_groups=4, untie=True), (2, 2)),
    (dict(num_query_groups=2, extra_state="empty"), (4, 1)),  # TE's extra state; TP 4 > 2 groups
])
def test_consolidated_view_holds_the_model_as_one(mnt, expected, kw, shape):
    root = mnt / "ckpt"
    write(root, *shape, **kw)
    want = expected(kw, shape[0])
    got = torch.load(root / "iter_0000100" / ".views" / "consolidated" / "model.pt")
    tensors = {k: v for k, v in got.items() if isinstance(v, torch.Tensor)}
    assert sorted(tensors) == sorted(want)
    for k, t in want.items():
        assert tensors[k].dtype == t.dtype and tensors[k].shape == t.shape, k
        assert torch.equal(tensors[k].view(torch.int16), t.view(torch.int16)), k
    # The ShardedObjects as saved: each linear's extra state per layer, each rank's RNG state.
    T, P = shape
    rng = [k for k in got if k.startswith("rng_state/shard_")]
    assert sorted(rng) == sorted(f"rng_state/shard_{p}.{t}_{P}.{T}" for p in range(P)
                                 for t in range(T))
    assert isinstance(got[rng[0]][0][0]["torch_rng_state"], torch.Tensor)
    extra = got["decoder.layers.self_attention.linear_qkv._extra_state/shard_0_4"]
    if kw.get("extra_state") == "empty":
        assert extra[0].dtype == torch.uint8 and extra[0].numel() == 0
    else:
        assert extra == [None]


def hf_reference(want, cfg):
    """HF's tensors from the global ones: written here from Megatron's layout, not the view's."""
    L, hd, g = cfg.num_layers, cfg.head_dim, cfg.groups
    qh, F = cfg.num_attention_heads // g, cfg.ffn_hidden_size
    vocab = cfg.vocab_size
    pre = "decoder.layers."
    out = {"model.embed_tokens.weight": want["embedding.word_embeddings.weight"][:vocab],
           "model.norm.weight": want["decoder.final_layernorm.weight"]}
    if cfg.untie:
        out["lm_head.weight"] = want["output_layer.weight"][:vocab]
    for l in range(L):
        p = f"model.layers.{l}."
        qkv = want[pre + "self_attention.linear_qkv.weight"][l].view(g, (qh + 2) * hd, -1)
        out[p + "self_attn.q_proj.weight"] = qkv[:, :qh * hd].reshape(-1, cfg.hidden_size)
        out[p + "self_attn.k_proj.weight"] = qkv[:, qh * hd:(qh + 1) * hd].reshape(-1, cfg.hidden_size)
        out[p + "self_attn.v_proj.weight"] = qkv[:, (qh + 1) * hd:].reshape(-1, cfg.hidden_size)
        if cfg.qkv_bias:
            b = want[pre + "self_attention.linear_qkv.bias"][l].view(g, (qh + 2) * hd)
            out[p + "self_attn.q_proj.bias"] = b[:, :qh * hd].reshape(-1)
            out[p + "self_attn.k_proj.bias"] = b[:, qh * hd:(qh + 1) * hd].reshape(-1)
            out[p + "self_attn.v_proj.bias"] = b[:, (qh + 1) * hd:].reshape(-1)
        if cfg.qk_layernorm:
            for n in ("q", "k"):
                out[p + f"self_attn.{n}_norm.weight"] = want[pre + f"self_attention.{n}_layernorm.weight"][l]
        out[p + "self_attn.o_proj.weight"] = want[pre + "self_attention.linear_proj.weight"][l]
        out[p + "input_layernorm.weight"] = want[pre + "self_attention.linear_qkv.layer_norm_weight"][l]
        out[p + "post_attention_layernorm.weight"] = want[pre + "mlp.linear_fc1.layer_norm_weight"][l]
        fc1 = want[pre + "mlp.linear_fc1.weight"][l]
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = fc1[:F], fc1[F:]
        out[p + "mlp.down_proj.weight"] = want[pre + "mlp.linear_fc2.weight"][l]
    return out


@pytest.mark.parametrize("kw,shape,common_in_dcp", [
    (dict(num_query_groups=4, untie=True), (2, 2), False),
    (dict(num_query_groups=2, extra_state="empty"), (4, 1), False),
    (dict(num_query_groups=4), (2, 1), True),  # Megatron since 2026-07: no common.pt
    (dict(num_query_groups=4, untie=True), (1, 2), False),  # TP 1: one chunk, still padded
    (dict(num_query_groups=4, ffn_hidden_size=100), (4, 1), False),  # F / TP = 25: odd halves
    (dict(num_query_groups=4, per_layer_keys=True), (2, 2), False),  # decoder.layers.N.X keys
    (dict(num_query_groups=2, qkv_bias=True), (2, 2), False),  # Qwen2ForCausalLM
    (dict(num_query_groups=2, qk_layernorm=True), (2, 1), False),  # Qwen3ForCausalLM
])
def test_hf_view_of_a_torch_dist_checkpoint(mnt, expected, kw, shape, common_in_dcp):
    sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
    from test_views_hf import load_view
    root = mnt / "ckpt"
    kw = dict(kw)
    per_layer_keys = kw.pop("per_layer_keys", False)
    cfg = write(root, *shape, common_in_dcp, per_layer_keys, **kw)
    assert (root / "iter_0000100" / "common.pt").exists() != common_in_dcp
    views = sorted(os.listdir(root / ".views"))
    assert views == ["hf"], views  # Megatron reshards torch_dist itself: no tpT-ppP views
    got, _ = load_view(root / ".views" / "hf")
    want = hf_reference(expected(kw, shape[0]), cfg)
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].shape == t.shape, k
        assert torch.equal(got[k].view(torch.int16), t.contiguous().view(torch.int16)), k
    config = json.loads((root / ".views" / "hf" / "config.json").read_text())
    assert config["num_key_value_heads"] == cfg.groups and config["vocab_size"] == cfg.vocab_size
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp1-pp1")
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "torch_dist" in errors and "reshards itself" in errors, errors


@pytest.mark.parametrize("common_in_dcp", [False, True])
def test_inspect_names_the_format_the_parallel_sizes_and_the_global_shapes(mnt, common_in_dcp):
    root = mnt / "ckpt"
    write(root, 2, 2, common_in_dcp, num_query_groups=4, untie=True)
    out = run([CKPTFS_BIN, "inspect", root]).stdout
    assert "dist_checkpoint=yes" in out
    assert "torch_dist iter_0000100:" in out and '"sharded_backend": "torch_dist"' in out, out
    assert "saved at TP 2 x PP 2 x DP 1, 4 data files" in out, out
    assert "model: 4 layers, hidden 64, 8 heads in 4 query groups, ffn 128 (SwiGLU)" in out, out
    # heads 8 + 2 x 4 groups, head_dim 8: 128 rows; SwiGLU's fc1 2 x 128; each layer one chunk
    # per TP rank (fc1: two), the layer axis first.
    for shape, chunks, key in (("[4,128,64]", 8, "decoder.layers.self_attention.linear_qkv.weight"),
                               ("[4,256,64]", 16, "decoder.layers.mlp.linear_fc1.weight"),
                               ("[1152,64]", 2, "embedding.word_embeddings.weight")):
        assert any(l.split()[1:] == [shape, str(chunks), key] for l in out.splitlines()), (key, out)
