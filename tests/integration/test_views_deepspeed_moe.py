# dpD views of native DeepSpeed MoE checkpoints (deepspeed.moe.layer.MoE, ZeRO stage 1/2;
# docs/views.md) through a real mount: a source written into the mount by
# tests/reshard/deepspeed_moe_fixture.py (DeepSpeed's layout, each fact traced there to
# DeepSpeed's code), its ROOT/.views/dpD files compared exactly with the reference the fixture
# computes from the source files alone, then read as DeepSpeed's load at DP=D would and checked
# against the generator's model. Runs in /usr/bin/python3.
import errno
import os
import shutil
import sys

import pytest
import torch

from conftest import REPO_ROOT, check_reads_are_stable, expect_errno, read_file

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import deepspeed_fixture as df  # noqa: E402
import deepspeed_moe_fixture as mf  # noqa: E402
import deepspeed_zero3_fixture as z3  # noqa: E402

TAG = "global_step10"

# source options, view DPs. Two MoE layers (group totals multiples of 8); three (padded
# moe groups, which 0.14.4's mappings name only in part: see the refusal below).
CASES = {
    "dp4-ep2-0.14.4-mappings": (dict(dp=4, ep=2), (2, 8)),
    "dp2-ep2-own-mappings-padded": (dict(dp=2, ep=2, layers=3, psm="own"), (4, 8)),
    "dp4-ep2-data-before-expert": (dict(dp=4, ep=2, layers=3, psm="own", data_before_expert=True),
                                   (2, 8)),
    "dp4-ep4": (dict(dp=4, ep=4), (4, 8)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_moe_dp_views_equal_reference(mnt, case):
    kw, Ds = CASES[case]
    root = mnt / "ds"
    model = mf.generate(root, **kw)
    listed = os.listdir(root / ".views")
    for D in Ds:
        assert f"dp{D}" in listed, listed
        view = root / ".views" / f"dp{D}"
        assert read_file(view / "latest") == TAG.encode()
        mf.compare_dp(root, view, D, model=model)
    assert "universal" not in listed and "dp3" not in listed, listed
    check_reads_are_stable(view / TAG / f"bf16_zero_pp_rank_{Ds[-1] - 1}_mp_rank_00_optim_states.pt")


def test_swapped_expert_partitions_fail_the_comparison(mnt, tmp_path):
    # The comparison must see two EP ranks' moe partitions exchanged: a copy of dp2 (rank 0 is
    # EP rank 0, rank 1 EP rank 1) with the moe groups' fp32 partitions swapped fails it.
    root = mnt / "ds"
    model = mf.generate(root, dp=4, ep=2)
    view = tmp_path / "dp2"
    shutil.copytree(root / ".views" / "dp2", view)
    mf.compare_dp(root, view, 2, model=model)
    names = [view / TAG / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    objs = [torch.load(p) for p in names]
    a, b = (o["optimizer_state_dict"][df.SINGLE] for o in objs)
    a[2], b[2] = b[2], a[2]
    for o, p in zip(objs, names):
        torch.save(o, p)
    with pytest.raises(AssertionError):
        mf.compare_dp(root, view, 2)
    with pytest.raises(AssertionError, match="EP rank 0: layers.0.moe.* fp32 differs"):
        mf.check_model(view, 2, model)


def _why(root):
    return os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()


def test_moe_refusals(mnt):
    root = mnt / "ds"
    mf.generate(root, dp=4, ep=2)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp3")
    assert "dp3: dp3 of a DeepSpeed MoE checkpoint at ep_size 2: DeepSpeed needs the " \
           "data-parallel size to be a multiple of the expert-parallel size" in _why(root), _why(root)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "universal")
    assert "universal: a DeepSpeed MoE checkpoint (expert files, moe param groups) has no " \
           "universal view: DeepSpeed defines none for native MoE experts" in _why(root), \
        _why(root)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp1-dp2")
    assert "a DeepSpeed MoE checkpoint has no tensor-parallel views yet" in _why(root), _why(root)
    with pytest.raises(df.ViewError):
        mf.reference_dp(root, 3)  # the reference agrees


def test_moe_0_14_4_mappings_past_what_the_source_names_are_refused(mnt):
    # DeepSpeed 0.14.4 cuts the moe groups' param_slice_mappings by the full DP, so they name
    # the first half of each group (EP 2); at DP 8 the view's would reach two elements further.
    root = mnt / "ds"
    model = mf.generate(root, dp=4, ep=2, layers=3)
    with pytest.raises(df.ViewError, match="up to element 126"):
        mf.reference_dp(root, 8)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp8")
    assert "dp8: the source's param_slice_mappings of moe group 2 (cut by the full data-parallel " \
           "size, as DeepSpeed 0.14.4 writes them) name its parameters up to element 126" \
           in _why(root), _why(root)
    mf.compare_dp(root, root / ".views" / "dp2", 2, model=model)  # within what they name


def _edit_optimizer_files(root, dp, edit):
    """Applies edit(optimizer_state_dict) to every dp rank's optimizer file of ROOT's tag."""
    for r in range(dp):
        p = root / TAG / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
        o = torch.load(p)
        edit(o["optimizer_state_dict"])
        torch.save(o, p)


def test_moe_bf16_optimizer_is_refused(mnt):
    root = mnt / "ds"
    mf.generate(root, dp=2, ep=2)
    # BF16_Optimizer's state_dict has neither zero_stage nor a loss scaler.
    _edit_optimizer_files(root, 2, lambda sd: (sd.pop("zero_stage"), sd.pop("loss_scaler")))
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp4")
    assert "written by BF16_Optimizer" in _why(root), _why(root)


def test_moe_missing_optimizer_file_is_named(mnt):
    root = mnt / "ds"
    mf.generate(root, dp=4, ep=2)
    name = "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"
    os.unlink(root / TAG / name)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp2")
    assert name in _why(root) and "missing" in _why(root), _why(root)


def test_moe_with_tensor_parallelism_or_zero3_is_refused(mnt):
    root = mnt / "ds"
    mf.generate(root, dp=2, ep=2)
    shutil.copy(root / TAG / "mp_rank_00_model_states.pt", root / TAG / "mp_rank_01_model_states.pt")
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp2")
    assert "dp2: DeepSpeed MoE checkpoints with tensor parallelism (2 model-states files) have " \
           "no views yet" in _why(root), _why(root)
    root = mnt / "ds3"
    z3.generate(root, dp=2)
    torch.save({"layers.0.moe.deepspeed_moe.experts.deepspeed_experts.0.fc1.weight":
                torch.zeros(2)}, root / TAG / "layer_0_expert_0_mp_rank_00_model_states.pt")
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp4")
    assert "dp4: ZeRO stage 3 checkpoints with DeepSpeed MoE experts have no views yet" \
        in _why(root), _why(root)


def test_moe_checkpoint_without_moe_groups_is_refused(mnt):
    # num_experts and expert files, but an optimizer whose groups none marks moe (not made by
    # split_params_into_different_moe_groups_for_optimizer): nothing says which ranks hold what.
    root = mnt / "ds"
    mf.generate(root, dp=2, ep=2)
    _edit_optimizer_files(root, 2, lambda sd: [g.pop("moe", None)
                                               for g in sd[df.BASE]["param_groups"]])
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "dp2")
    assert "is a DeepSpeed MoE checkpoint (num_experts, or expert files) whose optimizer has no " \
           "param group marked moe" in _why(root), _why(root)
