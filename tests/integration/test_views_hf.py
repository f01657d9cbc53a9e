# The hf view of Megatron-LM checkpoints (docs/views.md, "Hugging Face"): ROOT/.views/hf/ through a
# real mount, for sources written by tests/reshard/megatron_fixture.py in Megatron's layout, checked
# against a mapping written here from the fixture's full model (HF's names; Q, K and V taken from
# the model's own per-head pieces; gate and up from SwiGLU's halves; the vocabulary unpadded), not
# from the view's code. Runs in /usr/bin/python3.
import errno
import json
import os
import struct
import sys

import pytest
import torch

from conftest import (CKPTFS_BIN, REPO_ROOT, check_reads_are_stable, expect_errno, read_file,
                      wait_for)

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_fixture as mf  # noqa: E402
from test_views_dcp import read_safetensors as dcp_read_safetensors  # noqa: E402

LLAMA = dict(swiglu=True, normalization="RMSNorm", position_embedding_type="rope", bias=False)
# The other architectures, by the args that choose them (docs/views.md, "Which architecture").
MISTRAL = dict(LLAMA, window_size=(5, 0))   # a query sees 5 keys back and its own: window 6
QWEN2 = dict(LLAMA, qkv_bias=True)          # biases on q, k and v only
QWEN3 = dict(LLAMA, qk_layernorm=True)      # per-head RMSNorm of q and k
ARCHS = {"llama": ("LlamaForCausalLM", LLAMA), "mistral": ("MistralForCausalLM", MISTRAL),
         "qwen2": ("Qwen2ForCausalLM", QWEN2), "qwen3": ("Qwen3ForCausalLM", QWEN3)}


def read_safetensors(path):
    """{name: tensor} of a safetensors file, by test_views_dcp.py's reader, and the hf view's
    own promises: the header's metadata, no bytes after the last tensor."""
    header, out = dcp_read_safetensors(path)
    assert header.pop("__metadata__") == {"format": "pt"}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    ends = sorted(v["data_offsets"][1] for v in header.values())
    assert 8 + n + ends[-1] == os.path.getsize(path), "bytes after the last tensor"
    return out


def expected(cfg, full):
    """The HF state dict of the fixture's model: HF names, bf16 as the rank files hold it."""
    bf = lambda t: t.to(torch.bfloat16)  # noqa: E731
    h, hd = cfg.hidden_size, cfg.head_dim
    vocab = cfg.vocab_size if cfg.args_vocab_size else cfg.padded_vocab(SOURCE_TP[0])
    word = full.tensor("word", "w", "master", (full.vocab_rows, h))
    sd = {"model.embed_tokens.weight": bf(word[:vocab])}
    for i in range(cfg.num_layers):
        piece = lambda canon, comp: bf(full.tensor(  # noqa: E731
            f"{i}.{canon}", comp, "master", mf.param_shape(cfg, f"{i}.{canon}")[comp]))
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = piece("in_norm.w", "w")
        sd[p + "self_attn.q_proj.weight"] = piece("qkv.w", "q")
        sd[p + "self_attn.k_proj.weight"] = piece("qkv.w", "k")
        sd[p + "self_attn.v_proj.weight"] = piece("qkv.w", "v")
        if cfg.qkv_bias:
            for c in "qkv":
                sd[p + f"self_attn.{c}_proj.bias"] = piece("qkv.b", c)
        if cfg.qk_layernorm:
            sd[p + "self_attn.q_norm.weight"] = piece("q_norm.w", "w")
            sd[p + "self_attn.k_norm.weight"] = piece("k_norm.w", "w")
        sd[p + "self_attn.o_proj.weight"] = piece("proj.w", "w")
        sd[p + "post_attention_layernorm.weight"] = piece("mlp_norm.w", "w")
        sd[p + "mlp.gate_proj.weight"] = piece("fc1.w", "gate")
        sd[p + "mlp.up_proj.weight"] = piece("fc1.w", "up")
        sd[p + "mlp.down_proj.weight"] = piece("fc2.w", "w")
    sd["model.norm.weight"] = bf(full.tensor("final_norm.w", "w", "master", (h,)))
    if cfg.untie:
        out = full.tensor("out", "w", "master", (full.vocab_rows, h))
        sd["lm_head.weight"] = bf(out[:vocab])
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (cfg.num_attention_heads * hd, h)
    return sd


SOURCE_TP = [1]  # the source's TP, for the padded vocabulary of a source without args.vocab_size


def load_view(view):
    """The view's state dict through its index, and the index."""
    index = json.loads(read_file(view / "model.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    sd = {}
    for f in files:
        part = read_safetensors(view / f)
        assert not set(part) & set(sd), "a tensor in two shards"
        for name in part:
            assert index["weight_map"][name] == f, name
        sd.update(part)
    assert set(sd) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in sd.values())
    return sd, index


def check_hf(root, cfg, full, tp, arch="llama"):
    SOURCE_TP[0] = tp
    view = root / ".views" / "hf"
    got, _ = load_view(view)
    want = expected(cfg, full)
    assert list(sorted(got)) == list(sorted(want))
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), name
    config = json.loads(read_file(view / "config.json"))
    assert config["architectures"] == [ARCHS[arch][0]] and config["model_type"] == arch
    assert config["hidden_size"] == cfg.hidden_size
    assert config["intermediate_size"] == cfg.ffn_hidden_size
    assert config["num_hidden_layers"] == cfg.num_layers
    assert config["num_attention_heads"] == cfg.num_attention_heads
    assert config["num_key_value_heads"] == cfg.groups
    assert config.get("head_dim", cfg.hidden_size // cfg.num_attention_heads) == cfg.head_dim
    if arch == "mistral":
        assert config["sliding_window"] == cfg.window_size[0] + 1
    elif arch in ("qwen2", "qwen3"):
        assert config["use_sliding_window"] is False
    if arch in ("llama", "qwen3"):
        assert config["attention_bias"] is False
    assert config["vocab_size"] == want["model.embed_tokens.weight"].shape[0]
    assert config["tie_word_embeddings"] == (not cfg.untie)
    assert config["rope_theta"] == 10000.0 and config["rms_norm_eps"] == 1e-5
    assert config["max_position_embeddings"] == cfg.max_position_embeddings
    assert config["torch_dtype"] == "bfloat16" and config["hidden_act"] == "silu"
    return view


@pytest.mark.parametrize("era,untie,groups,shape", [
    ("mcore", True, 4, (2, 2)),   # GQA, untied head, TP 2 x PP 2
    ("legacy", False, 4, (4, 1)),  # legacy names (input_norm, post_attention_norm, final_norm)
    ("mcore", False, 0, (2, 1)),  # no GQA: one group per head
    ("mcore", True, 2, (4, 2)),   # TP 4 a multiple of 2 query groups: a rank holds part of one
    ("mcore-te", False, 4, (2, 2)),  # Transformer Engine's extra state (empty uint8 tensors)
])
def test_hf_view_is_the_model_under_hf_names(mnt, era, untie, groups, shape):
    root = mnt / "ckpt"
    te = dict(extra_state="empty") if era == "mcore-te" else {}
    cfg = mf.ModelConfig(era=era.split("-")[0], untie=untie, num_query_groups=groups, **te,
                         **LLAMA)
    full = mf.save_checkpoint(root, cfg, *shape)
    assert "hf" in os.listdir(root / ".views")
    view = check_hf(root, cfg, full, shape[0])
    assert sorted(os.listdir(view)) == ["config.json", "model-00001-of-00001.safetensors",
                                        "model.safetensors.index.json"]
    check_reads_are_stable(view / "model-00001-of-00001.safetensors")


@pytest.mark.parametrize("arch,shape", [("mistral", (2, 2)), ("qwen2", (4, 1)), ("qwen2", (2, 2)),
                                        ("qwen3", (2, 2)), ("qwen3", (4, 1))])
def test_hf_view_serves_the_architecture_the_args_describe(mnt, arch, shape):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=arch != "qwen2", num_query_groups=2,
                         **ARCHS[arch][1])
    full = mf.save_checkpoint(root, cfg, *shape)
    assert "hf" in os.listdir(root / ".views")
    check_hf(root, cfg, full, shape[0], arch)


def test_hf_view_shards_by_size(make_mount):
    mnt = make_mount(options="hf_shard_size=40000")
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, **LLAMA)
    full = mf.save_checkpoint(root, cfg, 2, 1)
    view = check_hf(root, cfg, full, 2)
    _, index = load_view(view)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3, files
    for f in files:  # each shard within the bound unless one tensor alone exceeds it
        part = read_safetensors(view / f)
        size = sum(t.numel() * t.element_size() for t in part.values())
        assert size <= 40000 or len(part) == 1, (f, size)


@pytest.mark.parametrize("kw", [
    dict(args_vocab_size=False),  # a tokenizer set the size at run time
    dict(extra_args=dict(tokenizer_type="NullTokenizer")),  # its size was vocab_size + 1
])
def test_hf_view_keeps_the_padded_vocabulary_when_the_true_size_is_unknown(mnt, kw):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, **kw, **LLAMA)
    full = mf.save_checkpoint(root, cfg, 2, 1)
    SOURCE_TP[0] = 2
    got, _ = load_view(root / ".views" / "hf")
    config = json.loads(read_file(root / ".views" / "hf" / "config.json"))
    assert config["vocab_size"] == cfg.padded_vocab(2)
    rows = full.tensor("word", "w", "master", (full.vocab_rows, cfg.hidden_size))
    want = rows[:cfg.padded_vocab(2)].to(torch.bfloat16)
    assert torch.equal(got["model.embed_tokens.weight"].view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("kw,reason", [
    (dict(swiglu=True, position_embedding_type="rope", bias=False), "normalization is LayerNorm"),
    (dict(LLAMA, position_embedding_type="learned_absolute"), "not rope"),
    (dict(LLAMA, swiglu=False), "swiglu"),
    (dict(LLAMA, bias=True), "bias"),
    (dict(LLAMA, extra_args=dict(apply_layernorm_1p=True)), "gamma - 1"),
    (dict(LLAMA, extra_args=dict(rotary_seq_len_interpolation_factor=4)), "interpolation"),
    (dict(LLAMA, extra_args=dict(no_rope_freq=4)), "no_rope_freq"),
    (dict(LLAMA, extra_args=dict(rotary_base=None)), "args.rotary_base is missing"),
    (dict(LLAMA, extra_args=dict(qk_l2_norm=True)), "qk_l2_norm"),
    (dict(QWEN3, qkv_bias=True), "QKV biases with per-head q/k norms"),
    (dict(QWEN3, window_size=(5, 0)), "sliding window with per-head q/k norms"),
    (dict(QWEN2, window_size=(5, 0)), "sliding window with QKV biases"),
    (dict(MISTRAL, window_size=(5, 2)), "looks ahead"),
    (dict(MISTRAL, extra_args=dict(window_attn_skip_freq=2)), "mixes full and sliding"),
])
def test_hf_view_refuses_a_model_no_architecture_expresses(mnt, kw, reason):
    root = mnt / "ckpt"
    mf.save_checkpoint(root, mf.ModelConfig(era="mcore", **kw), 2, 1)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "hf")
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "hf: " in errors and reason in errors, errors
    assert "hf" not in os.listdir(root / ".views")  # offered only where it can be made


def test_hf_view_follows_a_new_save(mnt):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, **LLAMA)
    mf.save_checkpoint(root, cfg, 2, 1, iteration=100)
    before = read_file(root / ".views" / "hf" / "model-00001-of-00001.safetensors")
    cfg2 = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, seed=99, **LLAMA)
    full2 = mf.save_checkpoint(root, cfg2, 2, 1, iteration=200)
    # The kernel keeps view entries for a second; then the view is planned from iteration 200.
    shard = root / ".views" / "hf" / "model-00001-of-00001.safetensors"
    assert wait_for(lambda: read_file(shard), lambda b: b != before, timeout=10) != before
    check_hf(root, cfg2, full2, 2)


def gpu_devices():
    """"cpu", and "cuda" where torch sees a GPU (the GPU node runs that case)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch sees no GPU on this machine"))]


@pytest.mark.parametrize("device", gpu_devices())
def test_hf_view_loads_with_ckptfs_gpu(mnt, device):
    os.environ.setdefault("CKPTFS_GPU_LIB",
                          str(CKPTFS_BIN.resolve().parent.parent / "gpu" / "libckptfs_gpu.so"))
    sys.path.insert(0, str(REPO_ROOT / "gpu"))
    import ckptfs_gpu
    if device == "cuda":
        assert ckptfs_gpu.has_hip(), "libckptfs_gpu.so was built without a GPU runtime"
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", untie=True, num_query_groups=4, **LLAMA)
    full = mf.save_checkpoint(root, cfg, 2, 2)
    SOURCE_TP[0] = 2
    want = expected(cfg, full)
    shard = root / ".views" / "hf" / "model-00001-of-00001.safetensors"
    got = ckptfs_gpu.load(str(shard), device=device)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].device.type == device, name
        assert torch.equal(got[name].cpu().view(torch.int16), t.view(torch.int16)), name
