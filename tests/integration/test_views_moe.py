# Views of Megatron-LM mixture-of-experts checkpoints (--ckpt-format torch) through a real mount:
# ROOT/.views/tpT-ppP-epE (docs/views.md, "Mixture of experts"). The source is written into the
# mount by tests/reshard/megatron_moe_fixture.py at one shape; every view file is compared, bit
# for bit and sharing included, with the same model written by the fixture directly at the
# target shape. Runs in /usr/bin/python3.
import errno
import os
import sys

import pytest
import torch

from conftest import CKPTFS_BIN, REPO_ROOT, check_reads_are_stable, expect_errno, run

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_moe_fixture as mm  # noqa: E402

ITER = "iter_0000100"
SHARED = dict(shared_size=32, shared_gate=True)

# (fixture config, source (TP, PP, EP), target (TP, PP, EP)). 8 experts, 4 layers.
CASES = {
    # SequentialMLP (local_experts.{k}.*)
    "sequential-ep2-to-ep4": (dict(form="sequential"), (1, 1, 2), (1, 1, 4)),
    "sequential-shared-tp2ep4-to-tp1pp2ep2": (dict(form="sequential", **SHARED), (2, 1, 4),
                                              (1, 2, 2)),
    # mixed dense/MoE layers, tied embeddings: a target stage with no experts, a head copy
    "sequential-mixed-tied-ep2-to-pp4ep2": (dict(form="sequential", layer_freq=[1, 0, 0, 1],
                                                 untie=False), (1, 1, 2), (1, 4, 2)),
    # TEGroupedMLP (linear_fcN.weight{k}, one _extra_state per module)
    "te-bias-mixed-tp2pp2ep2-to-ep8": (dict(form="te", expert_bias=True,
                                            layer_freq=[1, 0, 1, 1]), (2, 2, 2), (1, 1, 8)),
    "te-ep1-to-tp2ep4": (dict(form="te", **SHARED), (1, 1, 1), (2, 1, 4)),
    # the legacy GroupedMLP (weight1/weight2, transposed, all local experts in one tensor)
    "grouped-shared-ep4-to-tp2ep2": (dict(form="grouped", shared_size=16), (1, 1, 4), (2, 1, 2)),
    "grouped-mixed-tp2ep2-to-pp2ep1": (dict(form="grouped", layer_freq=[0, 1, 0, 1]), (2, 1, 2),
                                       (1, 2, 1)),
    "grouped-tp4ep2-to-tp1ep8": (dict(form="grouped", expert_bias=True), (4, 1, 2), (1, 1, 8)),
}


def spec(shape):
    return f"tp{shape[0]}-pp{shape[1]}-ep{shape[2]}"


def check(mnt, tmp_path, kw, source, target, view_spec=None):
    root = mnt / "ckpt"
    cfg = mm.MoeConfig(**kw)
    mm.save_checkpoint(root, cfg, *source)
    want = tmp_path / "want"
    mm.save_checkpoint(want, mm.MoeConfig(**kw), *target)
    view = root / ".views" / (view_spec or spec(target))
    mm.compare(view, want, target, source)
    return root, view


@pytest.mark.parametrize("case", list(CASES))
def test_moe_view_equals_the_checkpoint_saved_at_the_target(mnt, tmp_path, case):
    kw, source, target = CASES[case]
    root, view = check(mnt, tmp_path, kw, source, target)
    assert (view / "latest_checkpointed_iteration.txt").read_bytes() == \
        (root / "latest_checkpointed_iteration.txt").read_bytes()
    some = sorted((view / ITER).iterdir())[-1] / mm.FILE
    check_reads_are_stable(some)


def test_tp_pp_view_of_an_moe_checkpoint_keeps_its_ep(mnt, tmp_path):
    # tpT-ppP: the source's EP (2), rank directories mp_rank_TT_EEE.
    root, view = check(mnt, tmp_path, dict(form="te"), (1, 1, 2), (2, 1, 2), view_spec="tp2-pp1")
    assert sorted(os.listdir(view / ITER)) == ["mp_rank_00_000", "mp_rank_00_001",
                                                "mp_rank_01_000", "mp_rank_01_001"]


def test_listing_offers_the_valid_ep_specs(mnt):
    root = mnt / "ckpt"
    mm.save_checkpoint(root, mm.MoeConfig(), 1, 1, 2)
    names = set(os.listdir(root / ".views"))
    for s in ("tp1-pp1", "tp2-pp2", "tp1-pp1-ep1", "tp2-pp1-ep8", "tp4-pp4-ep4"):
        assert s in names, sorted(names)
    # num_attention_heads 4 bounds TP at 4;
    # moe_ffn_hidden_size 16; EP up to 8 = num_experts; nothing beyond 8 is listed.
    assert not any(n.endswith("-ep16") or n.startswith("tp8") for n in names)
    assert "hf" in names  # as MixtralForCausalLM (test_views_hf_moe.py)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / "tp1-pp1-ep3")
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert "EP 3 does not divide num_experts 8" in errors, errors
    good = run([CKPTFS_BIN, "inspect", root, "--view", "tp2-pp2-ep4"], check=False)
    assert good.returncode == 0, good


def test_swapped_experts_and_shifted_ep_numbering_are_caught(mnt, tmp_path):
    # The comparison itself must see a wrong expert: a source whose EP rank 1 has its first two
    # local experts swapped, and a target whose EP numbering is off by one.
    root = mnt / "ckpt"
    kw = dict(form="sequential")

    def swap(sd, t, p, e):
        if e == 1:
            m = sd["model"]
            a = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"
            b = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
            m[a], m[b] = m[b], m[a]

    mm.save_checkpoint(root, mm.MoeConfig(**kw), 1, 1, 2, mutate=swap)
    want = tmp_path / "want"
    mm.save_checkpoint(want, mm.MoeConfig(**kw), 1, 1, 4)
    with pytest.raises(AssertionError, match="values differ"):
        mm.compare(root / ".views" / "tp1-pp1-ep4", want, (1, 1, 4), (1, 1, 2))
    shifted = tmp_path / "shifted"
    mm.save_checkpoint(shifted, mm.MoeConfig(ep_shift=1, **kw), 1, 1, 4)
    good = mnt / "good"
    mm.save_checkpoint(good, mm.MoeConfig(**kw), 1, 1, 2)
    with pytest.raises(AssertionError, match="values differ"):
        mm.compare(good / ".views" / "tp1-pp1-ep4", shifted, (1, 1, 4), (1, 1, 2))
    mm.compare(good / ".views" / "tp1-pp1-ep4", want, (1, 1, 4), (1, 1, 2))


DISTOPT = dict(distributed_optimizer=True)
# The distributed optimizer: distrib_optim.pt per sub-optimizer ([dense or None, experts] at EP >
# 1), compared like the model files.
DISTOPT_CASES = {
    "sequential-ep2-to-ep4": (dict(form="sequential", **DISTOPT), (1, 1, 2), (1, 1, 4)),
    "te-shared-tp2pp2ep2-to-tp1pp1ep2": (dict(form="te", **SHARED, **DISTOPT), (2, 2, 2),
                                         (1, 1, 2)),
    "sequential-tp2ep4-to-tp1pp2ep2-buckets": (
        dict(form="sequential", **DISTOPT, extra_args=dict(overlap_grad_reduce=True,
                                                           ddp_bucket_size=3000)),
        (2, 1, 4), (1, 2, 2)),
    # EP 1: one optimizer, the experts in the dense buffer
    "te-ep1-tp1-to-tp2pp2": (dict(form="te", **DISTOPT), (1, 1, 1), (2, 2, 1)),
}


@pytest.mark.parametrize("case", list(DISTOPT_CASES))
def test_moe_distributed_optimizer_view_equals_the_checkpoint_saved_at_the_target(mnt, tmp_path,
                                                                                  case):
    kw, source, target = DISTOPT_CASES[case]
    root, view = check(mnt, tmp_path, kw, source, target)
    for d in (view / ITER).iterdir():
        assert (d / mm.mf.DISTRIB_FILE).exists(), d
        check_reads_are_stable(d / mm.mf.DISTRIB_FILE)
    # The comparison sees a wrong expert state: EP rank 1's experts' exp_avg off in one element.
    if target[2] > 1:
        d = sorted((view / ITER).iterdir())[-1]
        got = torch.load(d / mm.mf.DISTRIB_FILE, weights_only=False)
        assert got[0] is None and got[1] is not None  # not the dense group's rank 0
        key = next(iter(got[1][0]))
        got[1][0][key]["exp_avg"][0] += 1.0
        bad = tmp_path / "bad.pt"
        torch.save(got, bad)
        want = torch.load(tmp_path / "want" / ITER / d.name / mm.mf.DISTRIB_FILE,
                          weights_only=False)
        with pytest.raises(AssertionError):
            mm.mf.assert_same(torch.load(bad, weights_only=False), want, "bad")


@pytest.mark.parametrize("kw,source,spec,why", [
    (DISTOPT, (1, 1, 2), "tp1-pp1-ep1", "is not moved between the two"),
    (dict(form="grouped", **DISTOPT), (1, 1, 2), "tp1-pp1-ep4",
     "GroupedMLP's experts is not resharded"),
    (dict(layer_freq=[1, 1, 0, 0], **DISTOPT), (1, 1, 2), "tp1-pp2-ep2",
     "pipeline stage 1 has no experts"),
])
def test_moe_distributed_optimizer_views_refused_say_why(mnt, kw, source, spec, why):
    root = mnt / "ckpt"
    mm.save_checkpoint(root, mm.MoeConfig(**kw), *source)
    expect_errno(errno.EINVAL, os.stat, root / ".views" / spec / ITER)
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert why in errors, errors


REFUSED = {
    # expert tensor parallelism other than TP: not a TP x PP x EP grid of files
    "etp": (dict(extra_args=dict(expert_tensor_parallel_size=1)), (2, 1, 2),
            "expert_tensor_parallel_size 1 differs from tensor_model_parallel_size 2"),
    # gate and up rows interleaved in blocks
    "glu-interleave": (dict(extra_args=dict(moe_mlp_glu_interleave_size=8)), (1, 1, 2),
                       "moe_mlp_glu_interleave_size"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_moe_sources_say_why(mnt, case):
    kw, source, why = REFUSED[case]
    root = mnt / "ckpt"
    mm.save_checkpoint(root, mm.MoeConfig(**kw), *source)
    for s in ("tp1-pp1-ep2", "tp1-pp1"):
        expect_errno(errno.EINVAL, os.stat, root / ".views" / s)
    assert os.listdir(root / ".views") == []
    errors = os.getxattr(root / ".views", "user.ckptfs.view_errors").decode()
    assert why in errors, errors
    bad = run([CKPTFS_BIN, "inspect", root, "--view", "tp1-pp1-ep2"], check=False)
    assert bad.returncode == 1, bad
    assert why in bad.stdout + bad.stderr
