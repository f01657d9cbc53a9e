# Data-parallel and universal views of DeepSpeed ZeRO 1/2 checkpoints (docs/views.md) through a
# real mount: a source written into the mount by tests/reshard/deepspeed_fixture.py (DeepSpeed's
# own layout, every structural fact traced there to DeepSpeed's source), its ROOT/.views/dpD and
# ROOT/.views/universal files loaded with torch.load and compared exactly with the references that
# deepspeed_fixture computes in Python from the source files (independent of the C++ view code),
# then loaded as DeepSpeed would at the new size and checked against the generator's model.
# Runs in /usr/bin/python3.
import errno
import os
import sys
import time

import pytest
import torch

from conftest import REPO_ROOT, check_reads_are_stable, expect_errno, read_file, wait_for

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import deepspeed_fixture as df  # noqa: E402
import deepspeed_zero3_fixture as z3  # noqa: E402

TAG = "global_step10"

# source DP, view DP, generator options. Group sizes 235 / 17 (TP 2: 135 / 11): padded at every
# DP, and at DP 4 and 8 whole trailing ranks of the no-decay group are padding.
DP_CASES = {
    "dp4-to-dp2-bf16-s2-fused-adam": (4, 2, dict()),
    "dp4-to-dp1-fp16-s1-torch-adamw-amsgrad": (4, 1, dict(dtype="fp16", stage=1,
                                                          optimizer="torch_adamw", amsgrad=True)),
    "dp2-to-dp4-bf16-s1-sgd": (2, 4, dict(stage=1, optimizer="sgd")),
    "dp3-to-dp8-fp16-s2-fused-adam-py311-enum": (3, 8, dict(dtype="fp16", enum_by_value=False)),
    "dp4-to-dp4-identity-torch-adamw": (4, 4, dict(optimizer="torch_adamw")),
    "dp4-to-dp2-cuda-locations": (4, 2, dict(optimizer="torch_adamw", cuda=True)),
    "dp2-to-dp3-fp16-sgd-cuda": (2, 3, dict(dtype="fp16", optimizer="sgd", cuda=True)),
    "dp2-to-dp1-tp2": (2, 1, dict(tp=2)),
    # BF16_Optimizer: fp32 partitions saved with their padding (235 elements at DP 4: 236)
    "dp4-to-dp2-bf16-optimizer-adamw": (4, 2, dict(stage=1, bf16_optimizer=True,
                                                   optimizer="torch_adamw")),
    "dp3-to-dp4-bf16-optimizer-tp2": (3, 4, dict(stage=1, bf16_optimizer=True, tp=2)),
}

UNIVERSAL_CASES = {
    "dp4-bf16-s2-fused-adam": (4, dict()),
    "dp1-fp16-s1-torch-adamw-py311-enum": (1, dict(dtype="fp16", stage=1,
                                                   optimizer="torch_adamw", enum_by_value=False)),
    "dp4-sgd-cuda-locations": (4, dict(optimizer="sgd", cuda=True)),
    "dp3-tp1-universal-info-amsgrad": (3, dict(optimizer="torch_adamw", amsgrad=True,
                                               uc_info=True)),
    "dp2-tp2-fp16": (2, dict(tp=2, dtype="fp16")),
    # parameter_to_average_patterns: the TP ranks' copies averaged (element 0 is -0.0 in each)
    "dp3-tp2-averaged": (3, dict(tp=2, uc_info=True, average=True)),
    "dp2-tp4-averaged-sgd": (2, dict(tp=4, uc_info=True, average=True, optimizer="sgd")),
    "dp1-tp1-averaged-fp16": (1, dict(uc_info=True, average=True, dtype="fp16")),
    "dp4-bf16-optimizer": (4, dict(stage=1, bf16_optimizer=True)),
    "dp3-tp2-bf16-optimizer-adamw": (3, dict(tp=2, stage=1, bf16_optimizer=True,
                                             optimizer="torch_adamw")),
}


@pytest.mark.parametrize("case", list(DP_CASES))
def test_dp_view_equals_reference(mnt, case):
    S, D, kw = DP_CASES[case]
    root = mnt / "ds"
    g = df.generate(root, dp=S, **kw)
    view = root / ".views" / f"dp{D}"
    assert read_file(view / "latest") == read_file(root / "latest") == TAG.encode()
    df.compare_dp(root, view, D, model=g)
    prefix = "" if kw.get("dtype") == "fp16" else "bf16_"
    check_reads_are_stable(view / TAG / f"{prefix}zero_pp_rank_{D - 1}_mp_rank_00_optim_states.pt")
    check_reads_are_stable(view / TAG / "mp_rank_00_model_states.pt")


@pytest.mark.parametrize("case", list(UNIVERSAL_CASES))
def test_universal_view_equals_reference(mnt, case):
    S, kw = UNIVERSAL_CASES[case]
    root = mnt / "ds"
    g = df.generate(root, dp=S, **kw)
    view = root / ".views" / "universal"
    assert read_file(view / "latest_universal") == TAG.encode()
    df.compare_universal(root, view, model=g)
    # the model-states files are the source's, byte for byte
    assert read_file(view / TAG / "mp_rank_00_model_states.pt") == \
        read_file(root / TAG / "mp_rank_00_model_states.pt")
    check_reads_are_stable(view / TAG / "zero" / "optimizer_state.pt")


def test_views_are_listed_and_others_resolve_on_lookup(mnt):
    root = mnt / "ds"
    df.generate(root, dp=4)
    assert ".views" not in os.listdir(root)  # hidden; resolves on lookup
    names = set(os.listdir(root / ".views"))
    assert {"dp1", "dp2", "dp4", "dp8", "universal"} <= names, names
    assert "dp3" not in names
    dp3 = root / ".views" / "dp3"
    assert os.path.isdir(dp3)
    assert sorted(os.listdir(dp3)) == sorted(["latest", TAG, "zero_to_fp32.py"])
    # DeepSpeed's recovery script, which its engine copies into the checkpoint root
    assert read_file(dp3 / "zero_to_fp32.py") == read_file(root / "zero_to_fp32.py")
    assert sorted(os.listdir(dp3 / TAG)) == sorted(
        ["mp_rank_00_model_states.pt"] +
        [f"bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt" for d in range(3)])
    df.compare_dp(root, dp3, 3)
    uni = root / ".views" / "universal"
    assert sorted(os.listdir(uni)) == sorted(["latest_universal", TAG])
    assert sorted(os.listdir(uni / TAG)) == ["mp_rank_00_model_states.pt", "zero"]
    zero = sorted(os.listdir(uni / TAG / "zero"))
    assert "optimizer_state.pt" in zero
    assert "language_model.embedding.word_embeddings.weight" in zero
    assert "language_model.embedding.tokentype_embeddings.weight" not in zero  # frozen
    assert sorted(os.listdir(uni / TAG / "zero" / zero[0])) == [
        "exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]


def test_view_follows_a_new_save(mnt):
    root = mnt / "ds"
    df.generate(root, dp=4, step=10)
    view = root / ".views" / "dp2"
    assert read_file(view / "latest") == b"global_step10"
    df.compare_dp(root, view, 2)
    g = df.generate(root, dp=4, step=20, seed=99)  # a new tag, then `latest` moves
    # The kernel keeps view entries for a second.
    got = wait_for(lambda: read_file(view / "latest"), lambda b: b == b"global_step20",
                   timeout=10)
    assert got == b"global_step20"
    assert sorted(os.listdir(view)) == ["global_step20", "latest", "zero_to_fp32.py"]
    df.compare_dp(root, view, 2, model=g)
    uni = root / ".views" / "universal"
    assert read_file(uni / "latest_universal") == b"global_step20"
    df.compare_universal(root, uni, model=g)


# ZeRO stage 3 sources: dp size, generator options. The parameters' sizes (80, 35, 10, 5, 60,
# 12, 60 elements) leave padding in the last partition at every dp size below but 1 and 5;
# sub_group_size 30 at DP 3 cuts the decay group into several sub-groups.
ZERO3_CASES = {
    "dp4-bf16-fused-adam": (4, dict()),
    "dp3-fp16-torch-adamw-sub-groups": (3, dict(dtype="fp16", optimizer="torch_adamw",
                                                sub_group_size=30)),
    "dp1-bf16-sgd": (1, dict(optimizer="sgd")),
}


@pytest.mark.parametrize("case", list(ZERO3_CASES))
def test_zero3_universal_view_equals_reference(mnt, case):
    D, kw = ZERO3_CASES[case]
    root = mnt / "ds3"
    g = z3.generate(root, dp=D, **kw)
    if kw.get("sub_group_size"):
        assert len(z3.sub_groups(D, kw["sub_group_size"])) > 2  # the case does what it says
    uni = root / ".views" / "universal"
    assert read_file(uni / "latest_universal") == TAG.encode()
    z3.compare_universal(root, model=g)
    check_reads_are_stable(uni / TAG / "zero" / "optimizer_state.pt")


# ZeRO stage 3 dpD: source dp, view dp, generator options. With sub_group_size 30 the decay
# group's sub-group boundaries differ between the two sizes (the test checks it).
ZERO3_DP_CASES = {
    "dp4-to-dp2-bf16-fused-adam": (4, 2, dict()),
    "dp3-to-dp5-fp16-torch-adamw-sub-groups": (3, 5, dict(dtype="fp16", optimizer="torch_adamw",
                                                          sub_group_size=30)),
    "dp2-to-dp1-sgd-sub-groups": (2, 1, dict(optimizer="sgd", sub_group_size=30)),
    "dp1-to-dp3-bf16": (1, 3, dict()),
    # One source sub-group cut into several at the smaller size: each gets a 'step' of its own.
    "dp4-to-dp2-torch-adamw-sub-groups-split": (4, 2, dict(optimizer="torch_adamw",
                                                            sub_group_size=30)),
}


@pytest.mark.parametrize("case", list(ZERO3_DP_CASES))
def test_zero3_dp_view_equals_reference(mnt, tmp_path, case):
    S, D, kw = ZERO3_DP_CASES[case]
    root = mnt / "ds3"
    z3.generate(root, dp=S, **kw)
    if kw.get("sub_group_size"):
        size = kw["sub_group_size"]
        assert z3.sub_groups(S, size) != z3.sub_groups(D, size)  # the case does what it says
    # What DeepSpeed writes at dp D for the same model (padding zeros, as the view writes it).
    z3.generate(tmp_path / "at-d", dp=D, pad=0.0, **kw)
    assert sorted(os.listdir(root / ".views")) == ["dp1", "dp2", "dp4", "dp8", "universal"]
    z3.compare_dp(root, D, expected_dir=tmp_path / "at-d")
    view = root / ".views" / f"dp{D}"
    prefix = "" if kw.get("dtype") == "fp16" else "bf16_"
    check_reads_are_stable(view / TAG / f"{prefix}zero_pp_rank_{D - 1}_mp_rank_00_optim_states.pt")
    check_reads_are_stable(view / TAG / z3.model_name(D - 1))
    if kw.get("optimizer") == "torch_adamw":
        # torch's AdamW steps each sub-group's 'step' tensor in place: none may be shared.
        o = torch.load(view / TAG / f"{prefix}zero_pp_rank_0_mp_rank_00_optim_states.pt")
        steps = [s["step"] for s in o["optimizer_state_dict"]["optimizer_state_dict"]["state"]
                 .values()]
        assert len(steps) > 1 and len({id(s) for s in steps}) == len(steps)


def test_zero3_refusals(mnt):
    root = mnt / "ds3"
    z3.generate(root, dp=2)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp2-dp2")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "tp2-dp2: a ZeRO stage 3 checkpoint has no tensor-parallel views" in why, why
    # A rank's files missing: a clear error for every view.
    os.unlink(root / TAG / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    time.sleep(1.5)  # the kernel keeps view entries for a second
    for spec in ("universal", "dp4"):
        expect_errno(errno.EINVAL, os.stat, root / ".views" / spec)
        why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
        assert "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" in why and "missing" in why, why


def test_averaged_parameter_with_a_16bit_slice_is_refused(mnt):
    # TP rank 1's fp32 partitions saved as bfloat16: an average of them would read the wrong
    # bytes, so the universal view refuses, naming the file and the dtype.
    root = mnt / "ds"
    df.generate(root, dp=1, tp=2, stage=1, uc_info=True, average=True)
    p = root / TAG / "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt"
    o = torch.load(p)
    sd = o["optimizer_state_dict"]
    sd[df.SINGLE] = [t.to(torch.bfloat16) for t in sd[df.SINGLE]]
    torch.save(o, p)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "universal")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "is averaged over TP ranks" in why and "holds it as bfloat16" in why, why


@pytest.mark.parametrize("Ts,S,T,D", [(2, 2, 4, 1), (4, 1, 2, 3), (2, 3, 1, 2)])
def test_pipeline_module_tp_view(mnt, tmp_path, Ts, S, T, D):
    # Megatron-DeepSpeed's GPTModelPipe keeps its weights in layer_XX-model_TT-model_states.pt
    # files. The source is the fixture's checkpoint laid out as the pipeline saves it
    # (df.to_pipe); every view of it must be the flat checkpoint's view laid out the same way.
    flat = tmp_path / "flat"
    df.generate(flat, dp=S, tp=Ts, stage=1, megatron=True)
    root = mnt / "ds"
    df.write_expected(df.to_pipe(df.load_tree(flat)), root)
    assert (root / TAG / "layer_02-model_00-model_states.pt").exists()
    assert torch.load(root / TAG / "mp_rank_00_model_states.pt")["module"] is None
    view = root / ".views" / f"tp{T}-dp{D}"
    df.compare_tree(view, df.to_pipe(df.reference_tp(flat, T, D)))
    check_reads_are_stable(view / TAG / f"layer_01-model_{T - 1:02d}-model_states.pt")
    df.compare_dp(root, root / ".views" / "dp2", 2)
    df.compare_universal(root)


def test_pipeline_layer_files(mnt):
    # A pipeline module (Megatron-DeepSpeed's GPTModelPipe) saves its layers in
    # layer_XX-model_TT-model_states.pt beside the model-states file: dpD copies them, the
    # universal view leaves them out as ds_to_universal does, tpT-dpD refuses a layer whose file
    # is missing on a TP rank.
    root = mnt / "ds"
    df.generate(root, dp=2, tp=2, stage=1)
    layer = root / TAG / "layer_01-model_00-model_states.pt"
    torch.save({"weight": torch.arange(6.0)}, layer)
    dp = root / ".views" / "dp4"
    assert read_file(dp / TAG / layer.name) == read_file(layer)
    df.compare_dp(root, dp, 4)  # the reference has the layer file too
    assert not (root / ".views" / "universal" / TAG / layer.name).exists()
    df.compare_universal(root)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp1-dp2")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "tp1-dp2: layer file layer_01-model_01-model_states.pt of global_step10 is missing" \
        in why, why


def test_missing_optim_file_fails_with_einval_and_a_reason(mnt):
    root = mnt / "ds"
    df.generate(root, dp=4)
    name = "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
    os.unlink(root / TAG / name)
    with pytest.raises(df.ViewError, match=name):
        df.reference_dp(root, 2)  # the reference agrees
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp2")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert name in why, why


def test_names_that_are_no_spec_fail_with_enoent_and_a_reason(mnt):
    root = mnt / "ds"
    df.generate(root, dp=4)
    for name in ("dp0", "nonsense", "dp-1"):
        expect_errno(errno.ENOENT, os.stat, root / ".views" / name)
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode().splitlines()
    for name in ("dp0", "nonsense", "dp-1"):
        line = next((x for x in why if x.startswith(name + ": ")), None)
        assert line and "dpD, tpT-dpD" in line and "universal" in line, why
    assert "view nonsense of directory inode" in mnt.log()
    # A valid spec looked up later is served, and leaves no error of its own.
    assert os.path.isdir(root / ".views" / "dp2")
    assert not any(x.startswith("dp2: ") for x in
                   os.getxattr(root / ".views", "user.ckptfs.view_errors").decode().splitlines())


def test_tp1_of_a_tp1_source_without_universal_info_is_dp(mnt):
    # Megatron-DeepSpeed writes no universal_checkpoint_info at TP 1 unless asked; TP does not
    # change, so tp1-dpD serves what dpD serves.
    root = mnt / "ds"
    df.generate(root, dp=4, uc_info=False)
    a, b = root / ".views" / "tp1-dp2" / TAG, root / ".views" / "dp2" / TAG
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for n in os.listdir(b):
        assert read_file(a / n) == read_file(b / n), n
    df.compare_dp(root, root / ".views" / "tp1-dp2", 2)


def test_views_are_read_only(mnt):
    root = mnt / "ds"
    df.generate(root, dp=2)
    view = root / ".views" / "dp2"
    f = view / TAG / "mp_rank_00_model_states.pt"
    expect_errno(errno.EROFS, open, view / TAG / "new.pt", "wb")
    expect_errno(errno.EROFS, open, root / ".views" / "new", "wb")
    expect_errno(errno.EROFS, open, f, "r+b")
    with pytest.raises(OSError):
        os.mkdir(view / "x")
    with pytest.raises(OSError):
        os.unlink(f)
    with pytest.raises(OSError):
        os.rename(f, view / TAG / "moved.pt")
    assert os.path.exists(f)


def test_directory_with_a_junk_latest_has_no_views(mnt):
    d = mnt / "plain"
    d.mkdir()
    (d / "latest").write_bytes(b"junk\n")
    (d / "notes.txt").write_bytes(b"hello")
    assert ".views" not in os.listdir(d)
    expect_errno(errno.ENOENT, os.stat, d / ".views")


def test_undecodable_checkpoint_lists_no_specs(mnt):
    # DeepSpeed's names, but not a ZeRO stage 1/2 checkpoint (no dp_world_size, no param_shapes):
    # .views is there and empty, so walking the directory meets no EINVAL.
    import torch
    d = mnt / "ds-odd"
    (d / TAG).mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}}, d / TAG / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, d / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (d / "latest").write_bytes(TAG.encode())
    assert ".views" not in os.listdir(d)
    assert os.listdir(d / ".views") == []
    walked = [os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs]
    assert sorted(walked) == sorted(["latest", f"{TAG}/mp_rank_00_model_states.pt",
                                     f"{TAG}/zero_pp_rank_0_mp_rank_00_optim_states.pt"])
    expect_errno(errno.EINVAL, os.stat, d / ".views" / "dp2")


# --- tpT-dpD: a new TP size (Megatron-DeepSpeed sources with universal_checkpoint_info) ---
# source TP, source DP, view TP, view DP, generator options. ZeRO stage 1: stage 2 saves the
# frozen tokentype embedding in frozen_param_shapes, which the view refuses. The sizes at TP 4
# (vocabulary 16 or 512 rows, qkv 12 rows, dense 12 columns) divide.
TP_CASES = {
    "tp2-to-tp1-dp2-megatron-args": (2, 2, 1, 2, dict(megatron=True)),
    "tp2-to-tp4-dp1-vocab-padded-to-512": (2, 2, 4, 1, dict()),
    # TP 1 with the TP pattern lists (Megatron-DeepSpeed writes none at TP 1: refused below)
    "tp1-to-tp2-dp3-uc-info-fp16-adamw-cuda": (1, 4, 2, 3, dict(
        uc_info=True, tp_lists=True, dtype="fp16", optimizer="torch_adamw", amsgrad=True,
        cuda=True)),
    "tp2-to-tp2-dp2-same-size": (2, 2, 2, 2, dict(megatron=True, optimizer="sgd")),
    "tp4-to-tp2-dp4-megatron": (4, 1, 2, 4, dict(megatron=True)),
    # parameter_to_average_patterns: the fp32 mean in the optimizer files, rounded in the module
    "tp2-to-tp4-dp2-averaged": (2, 2, 4, 2, dict(megatron=True, average=True)),
    "tp4-to-tp1-dp3-averaged-fp16": (4, 1, 1, 3, dict(megatron=True, average=True,
                                                      dtype="fp16")),
    "tp2-to-tp1-dp3-bf16-optimizer": (2, 4, 1, 3, dict(megatron=True, bf16_optimizer=True)),
}


@pytest.mark.parametrize("case", list(TP_CASES))
def test_tp_view_equals_reference(mnt, case):
    Ts, S, T, D, kw = TP_CASES[case]
    root = mnt / "ds"
    g = df.generate(root, dp=S, tp=Ts, stage=1, **kw)
    view = root / ".views" / f"tp{T}-dp{D}"
    assert f"tp{T}-dp{D}" not in os.listdir(root / ".views")  # resolves on lookup only
    assert read_file(view / "latest") == TAG.encode()
    df.compare_tp(root, view, T, D, model=g)
    prefix = "" if kw.get("dtype") == "fp16" else "bf16_"
    check_reads_are_stable(view / TAG / f"{prefix}zero_pp_rank_{D - 1}_mp_rank_{T - 1:02d}"
                           "_optim_states.pt")
    check_reads_are_stable(view / TAG / f"mp_rank_{T - 1:02d}_model_states.pt")


def test_tp_view_two_sub_params(mnt):
    # qkv weight declared a two-sub-param (SwiGLU-like) tensor: the merge takes every slice's
    # first half, then the second halves; the generator's layout is not that, so no model check
    root = mnt / "ds"
    df.generate(root, dp=2, tp=2, stage=1, megatron=True)
    p = root / TAG / "mp_rank_00_model_states.pt"
    ms = df.torch.load(p)
    ms["universal_checkpoint_info"]["parameter_with_2_sub_params_cat_dim_0"] = [
        r"language_model\.encoder\.layers\.\d+\.self_attention\.query_key_value\.weight"]
    df.torch.save(ms, p)
    df.compare_tp(root, root / ".views" / "tp1-dp2", 1, 2)
    df.compare_tp(root, root / ".views" / "tp3-dp1", 3, 1)
    # each half (6 rows) is cut in T: 4 does not divide it
    with pytest.raises(df.ViewError, match="query_key_value.weight"):
        df.reference_tp(root, 4, 1)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp4-dp1")


def test_sub_params_views(mnt):
    # qkv weight (12 rows) declared three sub-parameters of 4 rows (parameter_with_sub_params,
    # as for grouped-query attention's q, k, v): each TP 2 slice holds 2 rows of each. The
    # universal file regroups them and records the SubparamShape; a TP change cuts each one.
    root = mnt / "ds"
    df.generate(root, dp=2, tp=2, stage=1, megatron=True)
    p = root / TAG / "mp_rank_00_model_states.pt"
    ms = df.torch.load(p)
    qkv = "language_model.encoder.layers.0.self_attention.query_key_value.weight"
    ms["universal_checkpoint_info"]["parameter_with_sub_params"] = [
        {"patterns": [r"language_model\.encoder\.layers\.\d+\.self_attention\.query_key_value"
                      r"\.weight"], "shape": ((4, 4, 4), 5), "partition_dim": 0}]
    df.torch.save(ms, p)
    df.compare_universal(root)
    u = df.torch.load(root / ".views" / "universal" / TAG / "zero" / qkv / "fp32.pt")
    assert list(u) == ["sub_param_shape", "param"]
    assert vars(u["sub_param_shape"]) == {"patterns": ms["universal_checkpoint_info"][
        "parameter_with_sub_params"][0]["patterns"], "shape": ((4, 4, 4), 5), "partition_dim": 0}
    # rows 0-1 of the q block are rank 0's first two rows, rows 2-3 rank 1's first two
    src = df.Source(root)
    r0, r1 = src.local(0, qkv, "fp32"), src.local(1, qkv, "fp32")
    assert df.torch.equal(u["param"][:4], df.torch.cat([r0[:2], r1[:2]]))
    assert df.torch.equal(u["param"][8:], df.torch.cat([r0[4:], r1[4:]]))
    df.compare_tp(root, root / ".views" / "tp1-dp2", 1, 2)
    df.compare_tp(root, root / ".views" / "tp4-dp1", 4, 1)
    # 4 rows do not cut in 3
    with pytest.raises(df.ViewError, match="query_key_value"):
        df.reference_tp(root, 3, 1)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp3-dp1")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "sub-parameter of 4 does not split in 3" in why, why


@pytest.mark.parametrize("what", ["no universal_checkpoint_info", "T does not divide", "frozen",
                                  "TP 1 without TP lists"])
def test_tp_view_refusals(mnt, what):
    root = mnt / "ds"
    lists = dict(uc_info=True, tp_lists=True)
    T, kw, reason = {"no universal_checkpoint_info": (2, dict(), "universal_checkpoint_info"),
                     "T does not divide": (8, lists, "query_key_value"),
                     "frozen": (2, dict(lists, stage=2), "frozen"),
                     "TP 1 without TP lists": (2, dict(uc_info=True),
                                               "lists neither tp_replicated_parameter_patterns")
                     }[what]
    df.generate(root, dp=2, tp=1, **{"stage": 1, **kw})
    with pytest.raises(df.ViewError, match=reason):
        df.reference_tp(root, T, 2)  # the reference agrees
    expect_errno(errno.EINVAL, os.stat, root / ".views" / f"tp{T}-dp2")
    why = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert reason in why, why
    assert os.path.isdir(root / ".views" / "dp2")  # the other views stay
