# Checks of the DeepSpeed fixture and of the view references (no mount needed):
#   /usr/bin/python3 -m pytest -q tests/reshard/deepspeed_fixture_test.py
# The generator (which writes DeepSpeed's layout from the model) and the references (which work
# from the files alone) are independent; these tests hold them against each other, against facts of
# DeepSpeed's layout, and check that the comparisons reject a view that is wrong in one place.
import collections
import io
import os
import pickletools
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepspeed_fixture as df  # noqa: E402

NAMES = {0: "weight decay", 1: "no decay"}
COMBOS = {
    "bf16-s2-fused": dict(dtype="bf16", stage=2, optimizer="fused_adam"),
    "fp16-s1-adamw-amsgrad": dict(dtype="fp16", stage=1, optimizer="torch_adamw", amsgrad=True),
    "bf16-s1-sgd-cuda": dict(dtype="bf16", stage=1, optimizer="sgd", cuda=True),
    "fp16-s2-adamw-py311enum": dict(dtype="fp16", stage=2, optimizer="torch_adamw",
                                    enum_by_value=False),
    "bf16-s2-fused-tp2": dict(dtype="bf16", stage=2, optimizer="fused_adam", tp=2),
    "fp16-s2-sgd-tp1-ucinfo-cuda": dict(dtype="fp16", stage=2, optimizer="sgd", uc_info=True,
                                        cuda=True),
    "bf16-s1-adamw-tp4-averaged": dict(dtype="bf16", stage=1, optimizer="torch_adamw", tp=4,
                                       average=True),
}
IGNORE = {"zero_to_fp32.py"}


def test_padding_formula():
    # [ZERO] stage_1_and_2.py __init__: alignment 2*dp, only tail ranks padded.
    assert [df.rank_padding(1, 4, r) for r in range(4)] == [1, 2, 2, 2]
    assert df.aligned_numel(1, 4) == 8 and df.partition_size(1, 4) == 2
    assert [df.rank_padding(17, 4, r) for r in range(4)] == [0, 0, 1, 6]
    assert [df.rank_padding(235, 3, r) for r in range(3)] == [0, 0, 5]
    assert [df.rank_padding(16, 4, r) for r in range(4)] == [0, 0, 0, 0]
    m = df.slice_mappings([("a", 5), ("b", 7), ("c", 5)], 17, 4, 1)  # partition [6, 12)
    assert list(m) == ["b"] and (m["b"].numel, m["b"].start) == (6, 0)
    m = df.slice_mappings([("a", 5), ("b", 7), ("c", 5)], 17, 2, 0)  # ps 10: [0, 10)
    assert [(k, v.numel, v.start) for k, v in m.items()] == [("a", 5, 0), ("b", 5, 5)]
    assert list(vars(m["a"])) == ["numel", "start"]


def _globals(path):
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    out = io.StringIO()
    pickletools.dis(data, out)
    return [line.split("GLOBAL", 1)[1].strip().strip("'") for line in out.getvalue().splitlines()
            if "GLOBAL" in line], data


def test_layout_follows_deepspeed(tmp_path):
    g = df.generate(tmp_path, dp=4, dtype="fp16", stage=2, optimizer="torch_adamw", amsgrad=True)
    tag = "global_step10"
    assert (tmp_path / "latest").read_bytes() == tag.encode()
    assert sorted(os.listdir(tmp_path / tag)) == ["mp_rank_00_model_states.pt"] + [
        f"zero_pp_rank_{d}_mp_rank_00_optim_states.pt" for d in range(4)]
    ms = torch.load(tmp_path / tag / "mp_rank_00_model_states.pt")
    assert list(ms) == ["module", "buffer_names", "optimizer", "param_shapes",
                        "frozen_param_shapes", "shared_params", "frozen_param_fragments",
                        "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
                        "skipped_steps", "global_steps", "global_samples", "dp_world_size",
                        "mp_world_size", "ds_config", "ds_version", "iteration"]
    assert ms["optimizer"] is None and ms["sparse_tensor_module_names"] == set()
    assert ms["dp_world_size"] == 4 and ms["buffer_names"] == [df.BUFFERS[0][0]]
    assert type(ms["module"]) is collections.OrderedDict and "" in ms["module"]._metadata
    assert df.BUFFERS[1][0] not in ms["module"]  # non-persistent
    frozen = "language_model.embedding.tokentype_embeddings.weight"
    assert list(ms["frozen_param_shapes"]) == [frozen] and frozen in ms["module"]
    assert all(frozen not in s for s in ms["param_shapes"])
    totals = [sum(df._numel(s) for s in g.values()) for g in ms["param_shapes"]]
    assert totals == [235, 17]
    # bit16 params: views of one padded flat buffer per group; the fp32 masters hold more bits
    w = [ms["module"][n] for n in ms["param_shapes"][0]]
    assert len({t.storage().data_ptr() for t in w}) == 1
    assert w[0].storage().size() == df.aligned_numel(235, 4) and w[0].dtype == torch.float16
    masters = df._zero_to_fp32(tmp_path / tag, 0, 4, False, 4)
    for n, t in masters.items():
        assert t.dtype == torch.float32 and torch.equal(t, g.local(n, "master", 0))
        assert not torch.equal(t, t.half().float()), n
        assert torch.equal(ms["module"][n], t.half())
    names, data = _globals(tmp_path / tag / "zero_pp_rank_3_mp_rank_00_optim_states.pt")
    assert {"deepspeed.runtime.fp16.loss_scaler DynamicLossScaler",
            "deepspeed.runtime.zero.config ZeroStageEnum",
            "deepspeed.utils.tensor_fragment fragment_address"} <= set(names), names
    osd = torch.load(tmp_path / tag / "zero_pp_rank_3_mp_rank_00_optim_states.pt")[
        "optimizer_state_dict"]
    assert list(osd) == ["loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", df.BASE,
                         df.SINGLE, "zero_stage", "group_paddings", "partition_count",
                         "ds_version", df.PSM]
    assert list(vars(osd["loss_scaler"])) == [
        "cur_scale", "dynamic", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window",
        "min_scale", "delayed_shift", "cur_hysteresis", "consecutive_hysteresis",
        "raise_error_at_min_scale", "dtype"]
    assert osd["zero_stage"] is df.ZeroStageEnum.gradients and osd["dynamic_loss_scale"] is True
    # rank 3: weights [180, 235) of 235 (240, ps 60), and group 1 (17 -> 24, ps 6) all padding
    assert osd["group_paddings"] == [5, 6] and osd["partition_count"] == [4, 4]
    single = osd[df.SINGLE]
    assert [t.numel() for t in single] == [55, 0] and single[0].storage().size() == 60
    st = osd[df.BASE]["state"]
    assert list(st) == [0, 1] and list(st[0]) == ["step", "exp_avg", "exp_avg_sq",
                                                  "max_exp_avg_sq"]
    assert st[0]["step"].dim() == 0 and st[0]["step"].item() == 8.0  # fp16: 2 skipped steps
    assert st[1]["exp_avg"].numel() == 6 and not st[1]["exp_avg"].any()
    assert [g["params"] for g in osd[df.BASE]["param_groups"]] == [[0], [1]]
    assert [(n, a.numel, a.start) for n, a in osd[df.PSM][0].items()] == [
        ("language_model.encoder.layers.0.self_attention.dense.weight", 55, 0)]
    assert osd[df.PSM][1] == collections.OrderedDict()


def test_bf16_prefix_and_stage1_has_no_frozen_entries(tmp_path):
    df.generate(tmp_path, dp=2, dtype="bf16", stage=1, optimizer="sgd")
    names = sorted(os.listdir(tmp_path / "global_step10"))
    assert names[0] == "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    ms = torch.load(tmp_path / "global_step10" / "mp_rank_00_model_states.pt")
    assert ms["frozen_param_shapes"] is None and ms["frozen_param_fragments"] is None
    osd = torch.load(tmp_path / "global_step10" / names[0])["optimizer_state_dict"]
    assert osd["zero_stage"] is df.ZeroStageEnum.optimizer_states
    assert vars(osd["loss_scaler"]) == {"cur_scale": 1.0, "dynamic": False}
    assert list(osd[df.BASE]["state"][0]) == ["momentum_buffer"]


@pytest.mark.parametrize("combo", list(COMBOS))
def test_reference_of_the_source_size_is_the_source(tmp_path, combo):
    df.generate(tmp_path, dp=4, **COMBOS[combo])
    df.compare_tree(tmp_path, df.reference_dp(tmp_path, 4), IGNORE, framework_written=True)


@pytest.mark.parametrize("combo", list(COMBOS))
@pytest.mark.parametrize("S,D", [(4, 2), (2, 3), (1, 4), (3, 8)])
def test_reference_equals_the_generator_at_the_new_size(tmp_path, combo, S, D):
    if combo.endswith("tp2") and (S, D) not in ((4, 2), (3, 8)):
        pytest.skip("TP 2 runs two of the pairs")
    df.generate(tmp_path / "src", dp=S, **COMBOS[combo])
    df.generate(tmp_path / "want", dp=D, **COMBOS[combo])
    df.compare_tree(tmp_path / "want", df.reference_dp(tmp_path / "src", D), IGNORE, framework_written=True)


@pytest.mark.parametrize("combo", list(COMBOS))
@pytest.mark.parametrize("S", [1, 4])
def test_reference_universal_equals_the_model(tmp_path, combo, S):
    g = df.generate(tmp_path, dp=S, **COMBOS[combo])
    ref, want = df.reference_universal(tmp_path), g.universal()
    assert sorted(ref) == sorted(want)
    for rel in want:
        if isinstance(want[rel], bytes):
            assert ref[rel] == want[rel], rel
        else:
            df.assert_same(ref[rel], want[rel], rel)


def test_universal_vocab_and_patterns(tmp_path):
    g = df.generate(tmp_path, dp=2, tp=2)
    u = df.reference_universal(tmp_path)
    z = "global_step10/zero/"
    emb = u[z + "language_model.embedding.word_embeddings.weight/fp32.pt"]
    assert list(emb) == ["cat_dim", "vocab_tensor", "param"] and emb["param"].shape == (13, 5)
    assert list(u[z + df._L + "input_layernorm.weight/exp_avg.pt"]) == ["param"]
    assert u[z + df._L + "self_attention.dense.weight/fp32.pt"]["cat_dim"] == 1
    assert u[z + df._L + "self_attention.dense.weight/fp32.pt"]["param"].shape == (5, 12)
    assert u[z + df._L + "self_attention.query_key_value.bias/exp_avg_sq.pt"]["cat_dim"] == 0
    assert u[z + df._L + "input_layernorm.weight/step.pt"] == 10
    o = u[z + "optimizer_state.pt"]
    assert list(o) == ["loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "zero_stage",
                       "group_paddings", "partition_count", "ds_version", "param_groups"]
    assert o["group_paddings"] == [0, 0] and o["partition_count"] == [2, 2]
    assert not any(k.startswith(z + "language_model.embedding.tokentype") for k in u)  # frozen
    # a replicated parameter that differs between TP ranks cannot be merged
    p = tmp_path / "global_step10" / "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt"
    f = torch.load(p)
    f["optimizer_state_dict"][df.SINGLE][0][40] += 1  # position_embeddings on TP rank 1
    torch.save(f, p)
    with pytest.raises(df.ViewError, match="position_embeddings"):
        df.reference_universal(tmp_path)
    assert g.options.uc_info


def test_missing_optim_file_is_a_view_error(tmp_path):
    df.generate(tmp_path, dp=4)
    name = "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
    os.unlink(tmp_path / "global_step10" / name)
    for ref in (lambda: df.reference_dp(tmp_path, 2), lambda: df.reference_universal(tmp_path)):
        with pytest.raises(df.ViewError, match=name):
            ref()


# --- the comparisons accept the reference written out and reject it changed in one place ---

def _resave(path, change):
    obj = torch.load(path)
    change(obj)
    torch.save(obj, path)


def _flip_tensor_byte(t):
    t.view(torch.uint8).view(-1)[0] ^= 1


def _swap_first_keys(d):
    items = list(d.items())
    items[0], items[1] = items[1], items[0]
    d.clear()
    d.update(items)


def _flip_zip_data_byte(path):
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, e = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + n + e
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


OPT1 = "global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt"
MS = "global_step10/mp_rank_00_model_states.pt"
DP_TAMPER = {
    "tensor byte": (OPT1, lambda o: _flip_tensor_byte(
        o["optimizer_state_dict"][df.BASE]["state"][0]["exp_avg"]), "values differ"),
    "fp32 byte": (OPT1, lambda o: _flip_tensor_byte(o["optimizer_state_dict"][df.SINGLE][0]),
                  "values differ"),
    "key order": (OPT1, lambda o: _swap_first_keys(o["optimizer_state_dict"]), "keys"),
    "dp_world_size": (MS, lambda o: o.__setitem__("dp_world_size", 4), "dp_world_size"),
    "int step -> float": (OPT1, lambda o: o["optimizer_state_dict"][df.BASE]["state"][1]
                          .__setitem__("step", 10.0), "step"),
    "group_paddings": (OPT1, lambda o: o["optimizer_state_dict"]["group_paddings"].reverse(),
                       "group_paddings"),
    "scaler attribute order": (OPT1, lambda o: _swap_first_keys(
        o["optimizer_state_dict"]["loss_scaler"].__dict__), "loss_scaler"),
    "enum -> int": (OPT1, lambda o: o["optimizer_state_dict"].__setitem__("zero_stage", 2),
                    "zero_stage"),
    "padding not zero": (OPT1, lambda o: o["optimizer_state_dict"][df.BASE]["state"][1][
        "exp_avg"].__setitem__(-1, 1.0), "values differ"),
}


@pytest.fixture(scope="module")
def dp_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    g = df.generate(root / "src", dp=4, dtype="fp16", stage=2, optimizer="fused_adam")
    df.write_expected(df.reference_dp(root / "src", 2), root / "view")
    df.compare_dp(root / "src", root / "view", 2, model=g)  # the reference passes
    return root, g


@pytest.mark.parametrize("case", list(DP_TAMPER))
def test_compare_dp_rejects_a_changed_view(dp_case, tmp_path, case):
    root, g = dp_case
    view = tmp_path / "view"
    shutil.copytree(root / "view", view)
    rel, change, match = DP_TAMPER[case]
    _resave(view / rel, change)
    with pytest.raises(AssertionError, match=match):
        df.compare_dp(root / "src", view, 2, model=g)


def test_compare_dp_rejects_files_and_zips(dp_case, tmp_path):
    root, g = dp_case
    view = tmp_path / "view"
    shutil.copytree(root / "view", view)
    _flip_zip_data_byte(view / OPT1)
    with pytest.raises(AssertionError, match="CRC"):
        df.compare_dp(root / "src", view, 2, model=g)
    shutil.rmtree(view)
    shutil.copytree(root / "view", view)
    shutil.copy(view / OPT1, view / OPT1.replace("rank_1", "rank_2"))  # a file for d >= D
    with pytest.raises(AssertionError, match="extra"):
        df.compare_dp(root / "src", view, 2, model=g)
    os.unlink(view / OPT1.replace("rank_1", "rank_2"))
    (view / "latest").write_bytes(b"global_step10\n")
    with pytest.raises(AssertionError, match="latest"):
        df.compare_dp(root / "src", view, 2, model=g)


def test_compare_dp_checks_locations(tmp_path):
    g = df.generate(tmp_path / "src", dp=2, cuda=True, optimizer="torch_adamw")
    ref = df.reference_dp(tmp_path / "src", 4)
    df.write_expected(ref, tmp_path / "view")
    df.compare_dp(tmp_path / "src", tmp_path / "view", 4, model=g)
    got = df.Loaded(tmp_path / "view" / "global_step10" /
                    "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    st = got.obj["optimizer_state_dict"][df.BASE]["state"][0]
    assert got.location(st["exp_avg"]) == "cuda:0" and got.location(st["step"]) == "cpu"
    ms = df.Loaded(tmp_path / "view" / MS)
    assert ms.location(next(iter(ms.obj["module"].values()))) == "cuda:0"
    assert ms.location(next(iter(ms.obj["frozen_param_fragments"].values()))) == "cpu"
    # the same values saved on the cpu are rejected
    path = tmp_path / "view" / "global_step10" / "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"
    torch.save(torch.load(path, map_location="cpu"), path)
    with pytest.raises(AssertionError, match="storage location cpu, expected cuda:0"):
        df.compare_dp(tmp_path / "src", tmp_path / "view", 4, model=g)


U = "global_step10/zero/"
UNI_TAMPER = {
    "param byte": (U + df._L + "self_attention.dense.weight/exp_avg.pt",
                   lambda o: _flip_tensor_byte(o["param"]), "values differ"),
    "cat_dim": (U + df._L + "self_attention.dense.weight/fp32.pt",
                lambda o: o.__setitem__("cat_dim", 1), "cat_dim"),
    "group_paddings": (U + "optimizer_state.pt",
                       lambda o: o.__setitem__("group_paddings", [0, 6]), "group_paddings"),
}


@pytest.mark.parametrize("case", list(UNI_TAMPER) + ["missing step", "model file byte"])
def test_compare_universal_rejects_a_changed_view(tmp_path, case):
    g = df.generate(tmp_path / "src", dp=4, dtype="fp16", stage=1, optimizer="fused_adam")
    view = tmp_path / "view"
    df.write_expected(df.reference_universal(tmp_path / "src"), view)
    df.compare_universal(tmp_path / "src", view, model=g)
    if case == "missing step":
        os.unlink(view / U / (df._L + "input_layernorm.weight") / "step.pt")
        match = "missing"
    elif case == "model file byte":
        _flip_zip_data_byte(view / MS)
        match = "CRC"
    else:
        rel, change, match = UNI_TAMPER[case]
        _resave(view / rel, change)
    with pytest.raises(AssertionError, match=match):
        df.compare_universal(tmp_path / "src", view, model=g)


@pytest.mark.parametrize("combo", ["bf16-s2-fused-tp2", "fp16-s2-sgd-tp1-ucinfo-cuda",
                                   "fp16-s1-adamw-amsgrad"])
def test_compare_universal_accepts_the_reference(tmp_path, combo):
    g = df.generate(tmp_path / "src", dp=3, **COMBOS[combo])
    df.write_expected(df.reference_universal(tmp_path / "src"), tmp_path / "view")
    df.compare_universal(tmp_path / "src", tmp_path / "view", model=g)
    df.compare_universal(tmp_path / "src", tmp_path / "view")  # against the source alone


def test_cli(tmp_path):
    assert df.main(["generate", str(tmp_path / "src"), "--dp", "3", "--dtype", "fp16",
                    "--optimizer", "sgd", "--stage", "1"]) == 0
    assert df.main(["reference-dp", str(tmp_path / "src"), str(tmp_path / "v"), "--dp", "2"]) == 0
    assert df.main(["compare-dp", str(tmp_path / "src"), "--dp", "2", "--view",
                    str(tmp_path / "v")]) == 0
    assert df.main(["reference-universal", str(tmp_path / "src"), str(tmp_path / "u")]) == 0
    assert df.main(["compare-universal", str(tmp_path / "src"), "--view",
                    str(tmp_path / "u")]) == 0


# --- tpT-dpD: a new TP size ---
# ZeRO stage 1 (stage 2 has the frozen tokentype embedding in frozen_param_shapes: refused);
# megatron=True: args with make_vocab_size_divisible_by 4 (padded 16 at TP 1, 2, 4) and zero
# vocabulary padding rows, so the generator at the new TP is what the view must be.
TP = dict(stage=1, uc_info=True, megatron=True, tp_lists=True)
EMB = "language_model.embedding.word_embeddings.weight"


@pytest.mark.parametrize("tp,dp", [(1, 3), (2, 2), (4, 1)])
def test_reference_tp_of_the_source_size_is_the_source(tmp_path, tp, dp):
    df.generate(tmp_path, dp=dp, tp=tp, dtype="fp16", optimizer="torch_adamw", **TP)
    df.compare_tree(tmp_path, df.reference_tp(tmp_path, tp, dp), IGNORE, framework_written=True)


@pytest.mark.parametrize("Ts,S,T,D", [(2, 2, 4, 3), (2, 3, 1, 2), (1, 4, 2, 1), (4, 1, 2, 4),
                                      (1, 2, 4, 2)])
def test_reference_tp_equals_the_generator_at_the_new_tp(tmp_path, Ts, S, T, D):
    df.generate(tmp_path / "src", dp=S, tp=Ts, optimizer="sgd" if D == 1 else "fused_adam", **TP)
    g = df.generate(tmp_path / "want", dp=D, tp=T, optimizer="sgd" if D == 1 else "fused_adam",
                    **TP)
    ref = df.reference_tp(tmp_path / "src", T, D)
    df.compare_tree(tmp_path / "want", ref, IGNORE, framework_written=True)
    df.write_expected(ref, tmp_path / "view")
    df.compare_tp(tmp_path / "src", tmp_path / "view", T, D, model=g)


def test_reference_tp_pads_the_vocabulary_to_128_times_t(tmp_path):
    g = df.generate(tmp_path / "src", dp=2, tp=2, stage=1)  # no args: divisible by 128
    emb = torch.load(tmp_path / "src" / "global_step10" / "mp_rank_01_model_states.pt")
    assert (emb["module"][EMB][13 - 8:] != 0).all()  # the source's padding rows are not zero
    ref = df.reference_tp(tmp_path / "src", 4, 2)
    for t in range(4):
        ms = ref[f"global_step10/mp_rank_{t:02d}_model_states.pt"]
        assert ms["universal_checkpoint_info"]["padded_vocab_size"] == 512 and "args" not in ms
        assert ms["param_shapes"][0][EMB] == torch.Size([128, 5])
        assert (ms["mp_world_size"], ms["dp_world_size"]) == (4, 2)
        w = ms["module"][EMB]
        assert w.shape == (128, 5) and w.dtype == torch.bfloat16
        assert (w[13:] == 0).all() if t == 0 else (w == 0).all()
        if t == 0:
            assert torch.equal(w[:13], g.model.full(EMB, "master")[:13].to(torch.bfloat16))
    df.write_expected(ref, tmp_path / "view")
    df.compare_tp(tmp_path / "src", tmp_path / "view", 4, 2, model=g)


@pytest.mark.parametrize("what", ["no universal_checkpoint_info", "frozen", "T does not divide",
                                  "TP 1 without TP lists"])
def test_reference_tp_refusals(tmp_path, what):
    kw, T, match = {"no universal_checkpoint_info": (dict(stage=1), 2, "universal_checkpoint"),
                    "frozen": (dict(uc_info=True, tp_lists=True), 2, "frozen"),
                    "T does not divide": (TP, 8, "query_key_value.weight: dimension 0"),
                    "TP 1 without TP lists": (dict(stage=1, uc_info=True), 2, "lists neither")
                    }[what]
    df.generate(tmp_path, dp=2, **kw)
    with pytest.raises(df.ViewError, match=match):
        df.reference_tp(tmp_path, T, 2)


MS1 = "global_step10/mp_rank_01_model_states.pt"
OPT01 = "global_step10/bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt"
TP_TAMPER = {
    "vocab padding row": (MS1, lambda o: o["module"][EMB].__setitem__((-1, 0), 1.0),
                          "values differ"),
    "param_shapes": (MS1, lambda o: o["param_shapes"][0].__setitem__(EMB, torch.Size([5, 5])),
                     "param_shapes"),
    "mp_world_size": (MS1, lambda o: o.__setitem__("mp_world_size", 2), "mp_world_size"),
    "args tp": (MS1, lambda o: setattr(o["args"], "tensor_model_parallel_size", 2),
                "tensor_model_parallel_size"),
    "uc padded": (MS1, lambda o: o["universal_checkpoint_info"].__setitem__(
        "padded_vocab_size", 512), "padded_vocab_size"),
    "fp32 byte": (OPT01, lambda o: _flip_tensor_byte(o["optimizer_state_dict"][df.SINGLE][0]),
                  "values differ"),
    "slice mappings": (OPT01, lambda o: o["optimizer_state_dict"][df.PSM].reverse(),
                       "param_slice_mappings"),
}


@pytest.fixture(scope="module")
def tp_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    g = df.generate(root / "src", dp=2, tp=2, optimizer="torch_adamw", **TP)
    df.write_expected(df.reference_tp(root / "src", 4, 3), root / "view")
    df.compare_tp(root / "src", root / "view", 4, 3, model=g)  # the reference passes
    return root, g


@pytest.mark.parametrize("case", list(TP_TAMPER) + ["zip CRC", "a model-only check"])
def test_compare_tp_rejects_a_changed_view(tp_case, tmp_path, case):
    root, g = tp_case
    view = tmp_path / "view"
    shutil.copytree(root / "view", view)
    if case == "zip CRC":
        _flip_zip_data_byte(view / OPT01)
        match, src = "CRC", root / "src"
    elif case == "a model-only check":  # right for its source (another seed), not the model
        df.generate(tmp_path / "other", dp=2, tp=2, optimizer="torch_adamw", seed=7, **TP)
        shutil.rmtree(view)
        df.write_expected(df.reference_tp(tmp_path / "other", 4, 3), view)
        df.compare_tp(tmp_path / "other", view, 4, 3)
        match, src = "fp32", tmp_path / "other"
    else:
        rel, change, match = TP_TAMPER[case]
        _resave(view / rel, change)
        src = root / "src"
    with pytest.raises(AssertionError, match=match):
        df.compare_tp(src, view, 4, 3, model=g)


def test_cli_tp(tmp_path):
    assert df.main(["generate", str(tmp_path / "src"), "--dp", "2", "--tp", "2", "--stage", "1",
                    "--megatron"]) == 0
    assert df.main(["reference-tp", str(tmp_path / "src"), str(tmp_path / "v"), "--tp", "1",
                    "--dp", "3"]) == 0
    assert df.main(["compare-tp", str(tmp_path / "src"), "--tp", "1", "--dp", "3", "--view",
                    str(tmp_path / "v")]) == 0
    assert df.main(["reference-tp", str(tmp_path / "src"), str(tmp_path / "w"), "--tp", "8",
                    "--dp", "1"]) == 1  # qkv's 12 rows do not divide by 8
