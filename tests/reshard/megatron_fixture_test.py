# Checks of the Megatron fixture and of the view reference (no mount needed):
#   /usr/bin/python3 -m pytest tests/reshard/megatron_fixture_test.py
# The generator (which builds Megatron's layout from the model's own pieces) and the reference
# (which applies docs/views.md to the files) are independent; these tests hold them against each
# other and against facts of Megatron's layout.
import copy
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_fixture as mf  # noqa: E402


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def gen(root, tp, pp, **kw):
    cfg = mf.ModelConfig(**kw)
    full = mf.save_checkpoint(root, cfg, tp, pp)
    return cfg, full


def load_all(root):
    files, tps, pps = mf.rank_files(root)
    return {k: mf.Loaded(v) for k, v in files.items()}


CONFIGS = [
    dict(era="mcore"),
    dict(era="legacy"),
    dict(era="mcore", untie=True, swiglu=True, num_query_groups=4, normalization="RMSNorm",
         position_embedding_type="rope", bias=False),
    dict(era="legacy", untie=True, swiglu=True, num_query_groups=4, extra_state="empty"),
    dict(era="mcore", distinct_steps=True, skew_head=True, cuda_locations=True),
    dict(era="legacy", distinct_steps=True, skew_head=True, args_vocab_size=False),
    dict(era="mcore", fused_adam=True, untie=True),
    dict(era="mcore", sorted_groups=True),
]


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("tp,pp", [(1, 1), (4, 1), (2, 2), (4, 2)])
def test_reference_of_the_source_shape_is_the_source(tmp, kw, tp, pp):
    gen(tmp, tp, pp, **kw)
    ref = mf.reference_shard(tmp, tp, pp)
    mf.compare_view(tmp, ref, "iter_0000100")


def test_sorted_groups_put_weight_decay_first_on_later_stages(tmp):
    # The flag must change what is written, or the sorted-groups cases test nothing.
    gen(tmp / "a", 1, 2, era="mcore")
    gen(tmp / "b", 1, 2, era="mcore", sorted_groups=True)
    for root, wd_first in ((tmp / "a", False), (tmp / "b", True)):
        sd = torch.load(root / "iter_0000100" / "mp_rank_00_001" / "model_optim_rng.pt")
        groups = sd["optimizer"]["optimizer"]["param_groups"]
        assert (groups[0]["wd_mult"] == 1.0) == wd_first


def test_every_generated_file_loads_and_has_megatrons_structure(tmp):
    gen(tmp, 2, 2, era="legacy", cuda_locations=True)
    assert (tmp / "latest_checkpointed_iteration.txt").read_text() == "100"
    assert sorted(os.listdir(tmp / "iter_0000100")) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    files = load_all(tmp)
    for (t, p), f in files.items():
        sd = f.obj
        assert list(sd) == ["args", "checkpoint_version", "iteration", "model", "optimizer",
                            "opt_param_scheduler", "rng_state",
                            "num_floating_point_operations_so_far"]
        assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == 100
        assert sd["args"].tensor_model_parallel_size == 2
        lm = sd["model"]["language_model"]
        assert ("embedding" in lm) == (p == 0)
        assert ("word_embeddings_for_head" in sd["model"]) == (p == 1)
        assert "layers.0.self_attention.query_key_value._extra_state" in lm["encoder"]
        assert lm["encoder"]._metadata[""] == {"version": 1}
        opt = sd["optimizer"]
        assert list(opt) == ["optimizer", "fp32_from_fp16_params"]
        groups = opt["optimizer"]["param_groups"]
        # First appearance: stage 0 starts with the word embeddings (2-D), stage 1 with a norm.
        assert [g["wd_mult"] for g in groups] == ([1.0, 0.0] if p == 0 else [0.0, 1.0])
        assert [g["weight_decay"] for g in groups] == ([0.1, 0.0] if p == 0 else [0.0, 0.1])
        n = sum(len(g["params"]) for g in groups)
        assert sorted(opt["optimizer"]["state"]) == list(range(n))
        st = opt["optimizer"]["state"][0]
        assert list(st) == ["step", "exp_avg", "exp_avg_sq"]
        assert st["step"].dtype == torch.float32 and st["step"].dim() == 0
        assert f.location(st["step"]) == "cpu" and f.location(st["exp_avg"]) == f"cuda:{t + 2 * p}"
        rng = sd["rng_state"]
        assert isinstance(rng, list) and len(rng) == 1
        assert list(rng[0]) == ["random_rng_state", "np_rng_state", "torch_rng_state",
                                "cuda_rng_state", "rng_tracker_states"]
        assert f.location(rng[0]["torch_rng_state"]) == "cpu"
    # Masters are fp32 and round to the bf16 weights.
    sd = files[(1, 0)].obj
    w = sd["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]
    m = sd["optimizer"]["fp32_from_fp16_params"][0][0]
    assert m.dtype == torch.float32 and torch.equal(m.to(torch.bfloat16), w)


def test_mcore_tied_pp1_stores_only_the_output_layers_extra_state(tmp):
    gen(tmp, 1, 1, era="mcore")
    sd = torch.load(tmp / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt")
    assert "output_layer._extra_state" in sd["model"]
    assert "output_layer.weight" not in sd["model"]
    keys = list(sd["model"])
    # [MCORE] linear_proj before linear_qkv within a layer.
    assert keys.index("decoder.layers.0.self_attention.linear_proj.weight") < \
        keys.index("decoder.layers.0.self_attention.linear_qkv.weight")


def test_fused_qkv_is_laid_out_per_query_group(tmp):
    cfg, full = gen(tmp, 2, 1, era="mcore", num_query_groups=4, num_attention_heads=8,
                    hidden_size=64)
    hd, h = cfg.head_dim, cfg.hidden_size
    q = full.tensor("0.qkv.w", "q", "master", (8 * hd, h))
    k = full.tensor("0.qkv.w", "k", "master", (4 * hd, h))
    v = full.tensor("0.qkv.w", "v", "master", (4 * hd, h))
    sd = torch.load(tmp / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt")
    w = sd["model"]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert w.shape == ((8 + 2 * 4) // 2 * hd, h)
    # Rank 1 holds groups 2 and 3: [q4 q5 k2 v2 | q6 q7 k3 v3].
    rows = lambda x, i: x[i * hd:(i + 1) * hd]
    want = torch.cat([rows(q, 4), rows(q, 5), rows(k, 2), rows(v, 2),
                      rows(q, 6), rows(q, 7), rows(k, 3), rows(v, 3)]).to(torch.bfloat16)
    assert torch.equal(w, want)


def test_swiglu_shard_is_gate_then_up(tmp):
    cfg, full = gen(tmp, 2, 1, era="legacy", swiglu=True)
    f, h = cfg.ffn_hidden_size, cfg.hidden_size
    gate = full.tensor("1.fc1.w", "gate", "master", (f, h))
    up = full.tensor("1.fc1.w", "up", "master", (f, h))
    sd = torch.load(tmp / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt")
    w = sd["model"]["language_model"]["encoder"]["layers.1.mlp.dense_h_to_4h.weight"]
    assert torch.equal(w, torch.cat([gate[f // 2:], up[f // 2:]]).to(torch.bfloat16))


def strip_rank_specific(sd):
    """Drops what a view takes from another rank than a direct save would (rng_state, Adam's step)
    and the _metadata of containers (primary rank's in the view)."""
    sd = copy.copy(sd)
    sd.pop("rng_state", None)
    for st in sd["optimizer"]["optimizer"]["state"].values():
        st.pop("step", None)
    return sd


def drop_metadata(obj):
    if isinstance(obj, dict):
        if hasattr(obj, "_metadata"):
            del obj._metadata
        for v in obj.values():
            drop_metadata(v)


CROSS = [
    (dict(era="mcore"), 4, 1, [(2, 1), (1, 1), (4, 2), (2, 2)]),
    (dict(era="legacy", untie=True), 1, 1, [(4, 1), (2, 2)]),  # 1056 vocabulary rows -> 1152
    (dict(era="mcore", num_query_groups=4, swiglu=True, untie=True, bias=False,
          normalization="RMSNorm", position_embedding_type="rope"), 2, 2, [(4, 1), (1, 2), (4, 4)]),
    (dict(era="legacy", num_query_groups=2, swiglu=True), 2, 2, [(1, 1), (1, 4)]),
    (dict(era="mcore", skew_head=True, distinct_steps=True), 2, 2, [(4, 1), (1, 4)]),
]


@pytest.mark.parametrize("kw,tps,pps,targets", CROSS)
def test_reference_equals_a_direct_save_at_the_target_shape(tmp, kw, tps, pps, targets):
    """The docs' rules applied to the files equal Megatron's layout of the same model saved
    directly at the target shape. The direct save's vocabulary table is the source's padded table
    extended with copies of its last row, as the docs' padding rule (and Megatron's converter)
    extends it."""
    cfg, full = gen(tmp / "src", tps, pps, **kw, num_layers=4)
    src_rows = cfg.padded_vocab(tps)
    padded = mf.FullModel(cfg)
    for canon in ("word", "out"):
        for kind in mf.FullModel.KINDS:
            table = padded.tensor(canon, "w", kind, (padded.vocab_rows, cfg.hidden_size))
            table[src_rows:] = table[src_rows - 1]
    for T, P in targets:
        ref = mf.reference_shard(tmp / "src", T, P)
        d = tmp / f"direct{T}{P}"
        mf.save_checkpoint(d, cfg, T, P, full=padded)
        for (t, p), want in ref.files.items():
            got = mf.Loaded(mf.rank_dir(d, 100, t, p, P) / mf.FILE).obj
            a, b = strip_rank_specific(got), strip_rank_specific(want)
            drop_metadata(a)
            drop_metadata(b)
            mf.assert_same(a, b, f"tp{T}-pp{P}/{t},{p}")


def test_vocabulary_is_cut_or_extended_with_the_last_row(tmp):
    # vocab 1000, divisible by 96: padded(1) = 1056, padded(4) = 1152.
    gen(tmp / "a", 1, 1, era="mcore", untie=True)
    ref = mf.reference_shard(tmp / "a", 4, 1)
    src = torch.load(tmp / "a" / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt")
    table = src["model"]["embedding.word_embeddings.weight"]
    assert table.shape[0] == 1056
    got = torch.cat([ref.files[(t, 0)]["model"]["embedding.word_embeddings.weight"]
                     for t in range(4)])
    assert got.shape[0] == 1152
    assert torch.equal(got[:1056], table)
    assert torch.equal(got[1056:], table[-1:].expand(96, -1))
    assert all(ref.files[(t, 0)]["args"].padded_vocab_size == 1152 for t in range(4))
    # And back: cut to 1056.
    mf.write_reference(ref, tmp / "b", "iter_0000100")
    back = mf.reference_shard(tmp / "b", 1, 1)
    assert torch.equal(back.files[(0, 0)]["model"]["embedding.word_embeddings.weight"], table)


def test_round_trip_tp4_tp2_tp4(tmp):
    gen(tmp / "a", 4, 1, era="mcore", num_query_groups=4, swiglu=True, untie=True)
    mf.write_reference(mf.reference_shard(tmp / "a", 2, 1), tmp / "b", "iter_0000100")
    back = mf.reference_shard(tmp / "b", 4, 1)
    orig = load_all(tmp / "a")
    for (t, p), sd in back.files.items():
        o = orig[(t, p)].obj
        for k in ("model", "optimizer", "args", "opt_param_scheduler", "iteration"):
            mf.assert_same(o[k], sd[k], f"{t}.{k}")
        # Pass-through fields come from the primary rank: tp2 rank t//2 took tp4 rank 2*(t//2)'s.
        mf.assert_same(orig[(2 * (t // 2), 0)].obj["rng_state"], sd["rng_state"], "rng")


def test_round_trip_pp2_pp1_pp2_legacy_tied(tmp):
    gen(tmp / "a", 2, 2, era="legacy")
    mf.write_reference(mf.reference_shard(tmp / "a", 2, 1), tmp / "b", "iter_0000100")
    one = load_all(tmp / "b")
    assert "word_embeddings_for_head" not in one[(0, 0)].obj["model"]
    back = mf.reference_shard(tmp / "b", 2, 2)
    orig = load_all(tmp / "a")
    for (t, p), sd in back.files.items():
        o = orig[(t, p)].obj
        a, b = copy.deepcopy(o["model"]), copy.deepcopy(sd["model"])
        drop_metadata(a)
        drop_metadata(b)
        mf.assert_same(a, b, f"{t},{p}.model")
        mf.assert_same(o["optimizer"], sd["optimizer"], f"{t},{p}.optimizer")
        mf.assert_same(o["args"], sd["args"], f"{t},{p}.args")


def test_tied_head_copy_comes_from_the_word_embeddings_when_the_source_has_none(tmp):
    gen(tmp, 2, 1, era="mcore", distinct_steps=True)
    ref = mf.reference_shard(tmp, 2, 2)
    src = load_all(tmp)
    for t in range(2):
        last = ref.files[(t, 1)]
        keys = list(last["model"])
        assert keys[-2:] == ["output_layer.weight", "output_layer._extra_state"]
        word = src[(t, 0)].obj["model"]["embedding.word_embeddings.weight"]
        assert torch.equal(last["model"]["output_layer.weight"], word)
        assert "output_layer._extra_state" not in ref.files[(t, 0)]["model"]
        # Its optimizer state is the embeddings' (step too: the same source shard).
        opt = last["optimizer"]
        g = opt["optimizer"]["param_groups"]
        assert [x["wd_mult"] for x in g] == [0.0, 1.0]
        idx = g[1]["params"][-1]
        sopt = src[(t, 0)].obj["optimizer"]
        sidx = sopt["optimizer"]["param_groups"][0]["params"][0]
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt["optimizer"]["state"][idx][k],
                               sopt["optimizer"]["state"][sidx][k])
        assert torch.equal(opt["fp32_from_fp16_params"][1][-1], sopt["fp32_from_fp16_params"][0][0])
    # Legacy: a top-level word_embeddings_for_head.
    gen(tmp / "l", 1, 1, era="legacy")
    ref = mf.reference_shard(tmp / "l", 1, 2)
    assert list(ref.files[(0, 1)]["model"]) == ["language_model", "word_embeddings_for_head"]


def test_replicated_tensors_and_steps_come_from_the_rules_source_ranks(tmp):
    gen(tmp, 4, 1, era="mcore", skew_replicas=True, distinct_steps=True)
    ref = mf.reference_shard(tmp, 2, 1)
    src = load_all(tmp)
    name = "decoder.layers.1.input_layernorm.weight"
    for t in range(2):
        assert torch.equal(ref.files[(t, 0)]["model"][name], src[(0, 0)].obj["model"][name])
    assert not torch.equal(src[(1, 0)].obj["model"][name], src[(0, 0)].obj["model"][name])
    # Step of a row-parallel weight on target rank 1: first column 1/2 of the way -> source rank 2.
    pname = "decoder.layers.1.self_attention.linear_proj.weight"
    assert torch.equal(state_of(ref.files[(1, 0)], pname)["step"],
                       state_of(src[(2, 0)].obj, pname)["step"])
    # ... and of a column-parallel one on target rank 1: source rank 2 as well; rank 0: 0.
    pname = "decoder.layers.1.self_attention.linear_qkv.weight"
    assert torch.equal(state_of(ref.files[(0, 0)], pname)["step"],
                       state_of(src[(0, 0)].obj, pname)["step"])
    assert not torch.equal(state_of(ref.files[(0, 0)], pname)["step"],
                           state_of(src[(1, 0)].obj, pname)["step"])
    # Pass-through from the primary source rank (2t).
    mf.assert_same(ref.files[(1, 0)]["rng_state"], src[(2, 0)].obj["rng_state"], "rng")


def state_of(sd, pname):
    """The Adam state of a parameter (one optimizer group per weight-decay class)."""
    params = [(".".join(p), v) for p, v in mf._walk(sd["model"])
              if isinstance(v, torch.Tensor) and not mf._is_extra(p)]
    opt = sd["optimizer"]["optimizer"]
    for g in opt["param_groups"]:
        members = [n for n, v in params if mf._no_wd(n, v) == (g["wd_mult"] == 0)]
        if pname in members:
            return opt["state"][g["params"][members.index(pname)]]
    raise KeyError(pname)


def test_invalid_targets_and_unknown_parameters(tmp):
    gen(tmp / "a", 2, 1, era="mcore", num_query_groups=4)
    with pytest.raises(mf.ViewError, match="TP 3 does not divide num_attention_heads 8"):
        mf.reference_shard(tmp / "a", 3, 1)
    mf.reference_shard(tmp / "a", 8, 1)  # megatron.core: TP a multiple of the query groups
    gen(tmp / "legacy", 2, 1, era="legacy", num_query_groups=4)
    with pytest.raises(mf.ViewError, match="TP 8 does not divide num_query_groups 4"):
        mf.reference_shard(tmp / "legacy", 8, 1)
    with pytest.raises(mf.ViewError, match="PP 3 does not divide num_layers 4"):
        mf.reference_shard(tmp / "a", 1, 3)
    gen(tmp / "b", 2, 1, era="mcore", mystery=True)
    with pytest.raises(mf.ViewError, match=r"model\.decoder\.layers\.0\.mystery\.weight"):
        mf.reference_shard(tmp / "b", 1, 1)
    gen(tmp / "c", 1, 2, era="legacy", mystery=True)
    with pytest.raises(mf.ViewError,
                       match=r"model\.language_model\.encoder\.layers\.0\.mystery\.weight"):
        mf.reference_shard(tmp / "c", 1, 1)


def test_args_are_rewritten(tmp):
    gen(tmp, 2, 2, era="legacy")
    ref = mf.reference_shard(tmp, 4, 1)
    a = ref.files[(3, 0)]["args"]
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size,
            a.transformer_pipeline_model_parallel_size, a.world_size, a.padded_vocab_size) == \
        (4, 1, 1, 8, 1152)
    assert a.num_query_groups == 1 and not a.group_query_attention


def test_compare_catches_differences(tmp):
    gen(tmp, 2, 1, era="mcore")
    ref = mf.reference_shard(tmp, 2, 1)
    bad = copy.deepcopy(ref.files[(1, 0)])
    bad["model"]["decoder.layers.0.mlp.linear_fc1.weight"][0, 0] += 1
    with pytest.raises(AssertionError, match="values differ"):
        mf.assert_same(bad, ref.files[(1, 0)])
    bad = copy.deepcopy(ref.files[(1, 0)])
    bad["args"].padded_vocab_size += 1
    with pytest.raises(AssertionError, match="padded_vocab_size"):
        mf.assert_same(bad, ref.files[(1, 0)])
    bad = copy.deepcopy(ref.files[(1, 0)])
    bad["model"]._metadata["x"] = {}
    with pytest.raises(AssertionError, match="_metadata"):
        mf.assert_same(bad, ref.files[(1, 0)])


def test_cli(tmp):
    me = Path(mf.__file__)
    assert mf.main(["generate", str(tmp / "a"), "--tp", "2", "--pp", "2", "--era", "legacy",
                    "--swiglu", "--groups", "4", "--marks", "--cuda"]) == 0
    assert mf.main(["reference", str(tmp / "a"), str(tmp / "b"), "--tp", "1", "--pp", "1"]) == 0
    assert mf.main(["compare", str(tmp / "a"), "--tp", "1", "--pp", "1",
                    "--view", str(tmp / "b")]) == 0
    assert mf.main(["reference", str(tmp / "a"), str(tmp / "c"), "--tp", "3", "--pp", "1"]) == 1
    assert me.exists()
