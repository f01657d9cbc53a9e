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


def check_consolidated(root, want):
    """model.pt of the iteration's consolidated view: its tensors are `want`'s {key: tensor}, bit
    for bit. Returns the state dict and its tensors."""
    got = torch.load(root / "iter_0000100" / ".views" / "consolidated" / "model.pt")
    tensors = {k: v for k, v in got.items() if isinstance(v, torch.Tensor)}
    assert sorted(tensors) == sorted(want)
    for k, t in want.items():
        assert tensors[k].dtype == t.dtype and tensors[k].shape == t.shape, k
        assert torch.equal(tensors[k].view(torch.int16), t.view(torch.int16)), k
    return got, tensors


@pytest.mark.parametrize("kw,shape", [
    (dict(num_query_groups=4, untie=True), (2, 2)),
    (dict(num_query_groups=2, extra_state="empty"), (4, 1)),  # TE's extra state; TP 4 > 2 groups
])
def test_consolidated_view_holds_the_model_as_one(mnt, expected, kw, shape):
    root = mnt / "ckpt"
    write(root, *shape, **kw)
    got, _ = check_consolidated(root, expected(kw, shape[0]))
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


# --- Mixture of experts ---------------------------------------------------------------------
# tests/reshard/torch_dist_moe_fixture.py writes megatron_moe_fixture's model (the same values)
# as torch_dist, its experts on an expert axis sharded by EP x expert TP across the ranks. The
# hf view of it must equal, tensor for tensor, the hf view of the same model written as legacy
# rank files (test_views_hf_moe checks that one against the model and megatron.core's logits),
# and the model's expected HF tensors.
import dataclasses  # noqa: E402

import megatron_moe_fixture as mm  # noqa: E402

MOE_FIXTURE = REPO_ROOT / "tests" / "reshard" / "torch_dist_moe_fixture.py"
MOE_GLOBAL = ("import sys, json, torch; sys.path.insert(0, sys.argv[1]); "
              "import torch_dist_moe_fixture as f, megatron_moe_fixture as mm; "
              "torch.save(f.global_tensors(mm.MoeConfig(**json.loads(sys.argv[2])), "
              "int(sys.argv[3])), sys.argv[4])")


def write_moe(root, shape, etp=None, common_in_dcp=False, **kw):
    """The torch_dist checkpoint of MoeConfig(**kw) at TP x PP x EP (expert TP etp), and that
    config."""
    T, P, EP = shape
    flags = (["--etp", str(etp)] if etp else []) + (["--common-in-dcp"] if common_in_dcp else [])
    subprocess.run([sys.executable, str(MOE_FIXTURE), str(root), "--tp", str(T), "--pp", str(P),
                    "--ep", str(EP), "--config", json.dumps(kw)] + flags, check=True, timeout=300)
    return mm.MoeConfig(**kw)


def legacy_twin(cfg):
    """The same model as legacy rank files can hold it: SequentialMLP experts (the legacy
    GroupedMLP's rank files hold them transposed, which their hf view refuses), without the args
    that only change how rank files are laid out (the distributed optimizer, single grouped
    weights)."""
    return dataclasses.replace(cfg, form="sequential" if cfg.form == "grouped" else cfg.form,
                               extra_args={})


# (MoeConfig fields, torch_dist (TP, PP, EP), expert TP (None: TP), legacy twin's (TP, PP, EP),
# HF class, model_type)
MOE_CASES = {
    "mixtral-tp2ep2": (dict(), (2, 1, 2), None, (1, 1, 2), "MixtralForCausalLM", "mixtral"),
    # Expert TP 1 under TP 2 (DP 2), the distributed optimizer, common state in DCP.
    "mixtral-etp1-pp2ep4-distopt": (dict(form="te", extra_args=dict(
        use_distributed_optimizer=True, moe_single_grouped_weight=True)), (2, 2, 4), 1,
        (2, 2, 2), "MixtralForCausalLM", "mixtral"),
    # The legacy GroupedMLP: one chunk holds an EP rank's experts.
    "mixtral-grouped-tied": (dict(form="grouped", untie=False, topk=1), (2, 1, 4), None,
                             (1, 1, 1), "MixtralForCausalLM", "mixtral"),
    "qwen3moe-mixed-tp2ep4": (dict(qk_layernorm=True, layer_freq=[1, 0, 1, 1]), (2, 1, 4), None,
                              (2, 1, 4), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "qwen3moe-presoftmax-pp2ep2": (dict(qk_layernorm=True, pre_softmax=True), (1, 2, 2), None,
                                   (1, 2, 2), "Qwen3MoeForCausalLM", "qwen3_moe"),
    "qwen2moe-shared-mixed": (dict(qkv_bias=True, shared_size=32, shared_gate=True,
                                   layer_freq=[0, 1, 1, 1], untie=False), (2, 2, 2), None,
                              (2, 2, 2), "Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen2moe-shared-etp2-tp1ep2": (dict(qkv_bias=True, shared_size=32, shared_gate=True),
                                    (1, 1, 2), 2, (1, 1, 2), "Qwen2MoeForCausalLM", "qwen2_moe"),
}


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_hf_view_of_a_torch_dist_moe_checkpoint_equals_the_rank_files_one(mnt, case):
    sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
    from test_views_hf import load_view
    from test_views_hf_logits import hf_forward
    from test_views_hf_moe import check_config, expected, hf_moe_mlp, megatron_moe_forward
    kw, shape, etp, legacy_shape, cls, arch = MOE_CASES[case]
    root, twin = mnt / "ckpt", mnt / "legacy"
    cfg = write_moe(root, shape, etp, common_in_dcp=case.endswith("distopt"), **kw)
    assert (root / "iter_0000100" / "common.pt").exists() != case.endswith("distopt")
    mm.save_checkpoint(twin, legacy_twin(cfg), *legacy_shape)
    assert sorted(os.listdir(root / ".views")) == ["hf"]
    got, _ = load_view(root / ".views" / "hf")
    want, _ = load_view(twin / ".views" / "hf")
    assert sorted(got) == sorted(want) == sorted(expected(cfg, arch))
    model = expected(cfg, arch)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), name
        assert torch.equal(got[name].view(torch.int16), model[name].view(torch.int16)), name
    config = json.loads((root / ".views" / "hf" / "config.json").read_text())
    assert config == json.loads((twin / ".views" / "hf" / "config.json").read_text())
    check_config(config, cfg, cls, arch)
    # The function: the view's logits under the architecture's semantics are megatron.core's
    # (computed from the twin's rank files).
    tokens = torch.randint(0, cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(5))
    want_logits = megatron_moe_forward(twin, legacy_twin(cfg), *legacy_shape, tokens)
    got_logits = hf_forward(got, config, tokens, mlp=hf_moe_mlp(config))
    assert torch.allclose(got_logits, want_logits, rtol=1e-9, atol=1e-9), (
        (got_logits - want_logits).abs().max())


@pytest.mark.parametrize("kw,shape,etp", [
    (dict(), (2, 1, 2), None),                                    # [L, E, 2F, H] stacked
    (dict(qk_layernorm=True, layer_freq=[1, 0, 1, 1], shared_size=16), (2, 2, 4), 1),  # per layer
    (dict(form="grouped"), (2, 1, 4), None),                      # chunks of several experts
])
def test_consolidated_view_holds_the_experts_at_their_global_shapes(mnt, workdir, kw, shape,
                                                                     etp):
    root = mnt / "ckpt"
    cfg = write_moe(root, shape, etp, **kw)
    out = workdir / "expected.pt"
    subprocess.run([sys.executable, "-c", MOE_GLOBAL, str(REPO_ROOT / "tests" / "reshard"),
                    json.dumps(kw), str(shape[0]), str(out)], check=True, timeout=300)
    got, tensors = check_consolidated(root, torch.load(out))
    L, E, H, F = cfg.num_layers, cfg.num_experts, cfg.hidden_size, cfg.moe_ffn_hidden_size
    if cfg.layer_freq == 1:
        fc1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"
        assert tensors[fc1].shape == (L, E, 2 * F, H)
        assert tensors["decoder.layers.mlp.experts.experts.linear_fc2.weight"].shape == (L, E, H, F)
        assert tensors["decoder.layers.mlp.router.weight"].shape == (L, E, H)
        extra = f"decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_1.5_{L}.{E}"
    else:
        for g in range(L):
            fc1 = f"decoder.layers.{g}.mlp.experts.experts.linear_fc1.weight"
            assert (fc1 in tensors) == cfg.moe_layer(g), g
            if cfg.moe_layer(g):
                assert tensors[fc1].shape == (E, 2 * F, H)
        extra = f"decoder.layers.2.mlp.experts.experts.linear_fc1._extra_state/shard_5_{E}"
    assert got[extra][0].dtype == torch.uint8 and got[extra][0].numel() == 0
    # Expert 5's gate rows, as the model has them.
    gate = mm.Values(cfg).get("2.expert5.fc1.gate", "master", (F, H)).to(torch.bfloat16)
    stored = (tensors["decoder.layers.mlp.experts.experts.linear_fc1.weight"][2]
              if cfg.layer_freq == 1 else
              tensors["decoder.layers.2.mlp.experts.experts.linear_fc1.weight"])
    assert torch.equal(stored[5, :F].view(torch.int16), gate.view(torch.int16))


def test_inspect_names_the_expert_axis_and_ep(mnt):
    root = mnt / "ckpt"
    write_moe(root, (2, 1, 4), etp=1, shared_size=16)
    out = run([CKPTFS_BIN, "inspect", root]).stdout
    assert "saved at TP 2 x PP 1 x DP 2, 4 data files" in out, out
    assert "experts: 8 per MoE layer (4 of 4 layers), ffn 16 each, top 2; shared experts ffn 16" \
        in out, out
    assert ("expert parallelism: EP 4 x expert TP 1, 2 experts per EP rank; expert axis: dim 1 of "
            "decoder.layers.mlp.experts.experts.* [layers, experts, ...]") in out, out
    # Each (layer, expert) one gate and one up chunk at expert TP 1.
    for shape, chunks, key in (("[4,8,32,32]", 64, "decoder.layers.mlp.experts.experts.linear_fc1.weight"),
                               ("[4,8,32,16]", 32, "decoder.layers.mlp.experts.experts.linear_fc2.weight"),
                               ("[4,8,32]", 4, "decoder.layers.mlp.router.weight")):
        assert any(l.split()[1:] == [shape, str(chunks), key] for l in out.splitlines()), (key, out)
    mixed = mnt / "mixed"
    write_moe(mixed, (1, 1, 2), qk_layernorm=True, layer_freq=[0, 1, 0, 1])
    out = run([CKPTFS_BIN, "inspect", mixed]).stdout
    assert "experts: 8 per MoE layer (2 of 4 layers)" in out, out
    assert ("EP 2 x expert TP 1, 4 experts per EP rank; expert axis: dim 0 of "
            "decoder.layers.N.mlp.experts.experts.* [experts, ...]") in out, out
    assert any(l.split()[1:] == ["[8,32,32]", "16", "decoder.layers.1.mlp.experts.experts.linear_fc1.weight"]
               for l in out.splitlines()), out


MOE_REFUSED = [
    (dict(extra_args=dict(moe_router_score_function="sigmoid")), "sigmoid"),
    (dict(pre_softmax=True), "unnormalised"),
    (dict(layer_freq=[1, 0, 1, 1]), "MixtralForCausalLM has experts in every layer"),
    (dict(extra_args=dict(moe_mlp_glu_interleave_size=8)), "interleaved in blocks"),
]


@pytest.mark.parametrize("kw,reason", MOE_REFUSED, ids=[r for _, r in MOE_REFUSED])
def test_hf_view_of_a_torch_dist_moe_checkpoint_refuses_with_the_reason(mnt, kw, reason):
    root = mnt / "ckpt"
    write_moe(root, (1, 1, 2), **kw)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "hf")
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "hf: " in errors and reason in errors, errors
