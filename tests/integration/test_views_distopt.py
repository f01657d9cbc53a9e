# The tpT-ppP views of a Megatron-LM checkpoint saved with --use-distributed-optimizer (legacy
# format): every rank directory of the view holds model_optim_rng.pt and distrib_optim.pt, the
# fp32 main parameters and Adam state laid out as Megatron builds its buffer at the target (the
# parameter order, the 64-element alignment, the buckets), so that load_parameter_state loads it
# unmodified at any DP size. Checked bitwise against the same model saved by the fixture directly
# at the target shape and another DP size (tests/reshard/megatron_distopt.py, written from
# Megatron's save code), not against the view's own code.
import errno
import os
import sys

import pytest
import torch

from conftest import REPO_ROOT, expect_errno

sys.path.insert(0, str(REPO_ROOT / "tests" / "reshard"))
import megatron_distopt as md  # noqa: E402
import megatron_fixture as mf  # noqa: E402

ITER = "iter_0000100"
LLAMA = dict(swiglu=True, normalization="RMSNorm", position_embedding_type="rope", bias=False)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def model_params(sd):
    """(name, numel) of the rank file's parameters, in its order (no extra state)."""
    return [(k, v.numel()) for k, v in sd["model"].items()
            if torch.is_tensor(v) and not k.endswith("_extra_state")]


def buckets(cfg, sd, P, p):
    return md.rank_layout(cfg, P, p, model_params(sd))[2]


def check_view(root, cfg, full, target, workdir, dp):
    """The view at `target` against the model saved directly there with DP `dp`."""
    T, P = target
    ref = workdir / f"ref-tp{T}-pp{P}"
    ref_cfg = mf.ModelConfig(**{**cfg.__dict__, "data_parallel_size": dp})
    mf.save_checkpoint(ref, ref_cfg, T, P, full=full)
    view = root / ".views" / f"tp{T}-pp{P}" / ITER
    assert sorted(os.listdir(view)) == sorted(mf.rank_name(t, p, P)
                                              for t in range(T) for p in range(P))
    for p in range(P):
        for t in range(T):
            rank = mf.rank_name(t, p, P)
            assert sorted(os.listdir(view / rank)) == [mf.DISTRIB_FILE, mf.FILE]
            got, want = load(view / rank / mf.DISTRIB_FILE), load(ref / ITER / rank / mf.DISTRIB_FILE)
            assert list(got) == ["buckets_coalesced", 0] and got["buckets_coalesced"] is True
            assert list(got[0]) == list(want[0]) == [(torch.bfloat16, torch.float32)]
            g, w = got[0][(torch.bfloat16, torch.float32)], want[0][(torch.bfloat16, torch.float32)]
            assert list(g) == list(w) == ["param", "exp_avg", "exp_avg_sq", "numel_unpadded"]
            assert g["numel_unpadded"] == w["numel_unpadded"], rank
            for key in ("param", "exp_avg", "exp_avg_sq"):
                assert g[key].dtype == torch.float32 and g[key].shape == w[key].shape, (rank, key)
                assert torch.equal(g[key], w[key]), (rank, key)
            gm, wm = load(view / rank / mf.FILE), load(ref / ITER / rank / mf.FILE)
            assert list(gm["model"]) == list(wm["model"]), rank
            for k, v in wm["model"].items():
                if torch.is_tensor(v):
                    assert torch.equal(gm["model"][k].view(torch.uint8).reshape(-1),
                                       v.view(torch.uint8).reshape(-1)), (rank, k)
            # The optimizer entry holds no per-parameter state, only the param groups, which
            # Megatron matches by their settings (wd_mult, lr_mult, ...), not by position.
            key = lambda g: sorted((k, repr(v)) for k, v in g.items())  # noqa: E731
            assert sorted(map(key, gm["optimizer"]["optimizer"]["param_groups"])) == \
                sorted(map(key, wm["optimizer"]["optimizer"]["param_groups"])), rank
            assert list(gm["optimizer"]) == list(wm["optimizer"]) == ["optimizer"]
            assert "state" not in gm["optimizer"]["optimizer"]
    return ref


@pytest.mark.parametrize("kw,source,targets", [
    # Tied embeddings (shared_embedding buckets on PP > 1), buckets of 20k elements on stage 0.
    (dict(extra_args=dict(overlap_grad_reduce=True, ddp_bucket_size=20000)), (2, 2),
     [(4, 1), (2, 1), (1, 2)]),
    # Llama: GQA, SwiGLU, untied head; the bucket size from ddp_num_buckets.
    (dict(num_query_groups=4, untie=True, extra_args=dict(overlap_grad_reduce=True,
                                                           ddp_num_buckets=3), **LLAMA),
     (4, 1), [(2, 2), (1, 4)]),
    # Hidden size 40, FFN 100: parameters that end off the 64-element grid, so the layout has
    # gaps (zeros) between them and where a bucket closes moves what follows.
    (dict(hidden_size=40, ffn_hidden_size=100,
          extra_args=dict(overlap_grad_reduce=True, ddp_bucket_size=5000)), (2, 2),
     [(4, 1), (1, 2), (2, 2)]),
    # One bucket (no overlap_grad_reduce); PP 1 -> 2 makes the tied head copy on the last stage.
    (dict(), (2, 1), [(2, 2), (4, 2)]),
])
def test_distributed_optimizer_view_equals_the_model_saved_at_the_target(mnt, workdir, kw, source,
                                                                        targets):
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(era="mcore", distributed_optimizer=True, **kw)
    full = mf.save_checkpoint(root, cfg, *source)
    if cfg.extra_args.get("overlap_grad_reduce"):  # the case has several buckets on stage 0
        sd = load(root / ITER / mf.rank_name(0, 0, source[1]) / mf.FILE)
        assert buckets(cfg, sd, source[1], 0) >= 2
    for i, target in enumerate(targets):
        check_view(root, cfg, full, target, workdir, dp=[1, 4, 8][i % 3])


def test_view_refuses_what_it_cannot_lay_out(mnt):
    # A legacy model (language_model.*): its shared embeddings are marked elsewhere.
    legacy = mnt / "legacy"
    mf.save_checkpoint(legacy, mf.ModelConfig(era="legacy", distributed_optimizer=True), 2, 1)
    expect_errno(errno.EINVAL, os.stat, legacy / ".views" / "tp1-pp1")
    errors = os.getxattr(legacy / ".views", "user.ckptfs.view_errors").decode()
    assert "legacy model" in errors, errors

    # args without overlap_grad_reduce: the bucket layout is unknown.
    noargs = mnt / "noargs"
    mf.save_checkpoint(noargs, mf.ModelConfig(distributed_optimizer=True,
                                              extra_args=dict(overlap_grad_reduce=None)), 2, 1)
    expect_errno(errno.EINVAL, os.stat, noargs / ".views" / "tp1-pp1")
    errors = os.getxattr(noargs / ".views", "user.ckptfs.view_errors").decode()
    assert "overlap_grad_reduce is absent" in errors, errors

    # distrib_optim.pt written with buckets the args do not describe: refused, not misread.
    # (Hidden size 40: parameters that are not multiples of 64 elements, so that where buckets
    # close changes the layout; with every size a multiple of 64 any bucketing lays out alike.)
    lying = mnt / "lying"
    cfg = mf.ModelConfig(distributed_optimizer=True, hidden_size=40,
                         extra_args=dict(overlap_grad_reduce=True, ddp_bucket_size=3000))
    mf.save_checkpoint(lying, cfg, 2, 1)
    for t in range(2):  # args now claim one bucket
        path = lying / ITER / mf.rank_name(t, 0, 1) / mf.FILE
        sd = load(path)
        sd["args"].overlap_grad_reduce = False
        torch.save(sd, path)
    expect_errno(errno.EINVAL, os.stat, lying / ".views" / "tp1-pp1")
    errors = os.getxattr(lying / ".views", "user.ckptfs.view_errors").decode()
    assert "not written with the layout its args describe" in errors, errors

    # A rank without its distrib_optim.pt.
    missing = mnt / "missing"
    mf.save_checkpoint(missing, mf.ModelConfig(distributed_optimizer=True), 2, 1)
    os.unlink(missing / ITER / mf.rank_name(1, 0, 1) / mf.DISTRIB_FILE)
    expect_errno(errno.EINVAL, os.stat, missing / ".views" / "tp1-pp1")
    errors = os.getxattr(missing / ".views", "user.ckptfs.view_errors").decode()
    assert "has no distrib_optim.pt" in errors, errors


def test_without_the_settings_the_layout_does_not_depend_on(mnt, workdir):
    # Every parameter a multiple of 64 elements (no biases): any bucketing lays them out alike,
    # so args without overlap_grad_reduce (an older Megatron's) are no reason to refuse.
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(distributed_optimizer=True, bias=False,
                         extra_args=dict(overlap_grad_reduce=None))
    full = mf.save_checkpoint(root, cfg, 2, 1)
    check_view(root, cfg, full, (1, 2), workdir, dp=2)


def test_a_checkpoint_saved_without_its_optimizer_serves_the_model(mnt, workdir):
    # --no-save-optim: no 'optimizer' in the rank files and no distrib_optim.pt.
    root = mnt / "ckpt"
    cfg = mf.ModelConfig(distributed_optimizer=True)
    full = mf.save_checkpoint(root, cfg, 2, 1)
    for t in range(2):
        d = root / ITER / mf.rank_name(t, 0, 1)
        os.unlink(d / mf.DISTRIB_FILE)
        sd = load(d / mf.FILE)
        del sd["optimizer"]
        sd["args"].no_save_optim = True
        torch.save(sd, d / mf.FILE)
    ref = workdir / "ref"
    mf.save_checkpoint(ref, cfg, 1, 2, full=full)
    view = root / ".views" / "tp1-pp2" / ITER
    for p in range(2):
        rank = mf.rank_name(0, p, 2)
        assert os.listdir(view / rank) == [mf.FILE]
        expect_errno(errno.ENOENT, os.stat, view / rank / mf.DISTRIB_FILE)
        got, want = load(view / rank / mf.FILE), load(ref / ITER / rank / mf.FILE)
        assert "optimizer" not in got
        for k, v in want["model"].items():
            if torch.is_tensor(v):
                assert torch.equal(got["model"][k].view(torch.uint8).reshape(-1),
                                   v.view(torch.uint8).reshape(-1)), (rank, k)
