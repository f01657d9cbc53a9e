# `ckptfs retain` through a real mount, on each checkpoint layout it recognizes (Megatron-LM
# iter_NNNNNNN with latest_checkpointed_iteration.txt, DeepSpeed global_stepN with latest, DCP
# step directories, plain directories by time): the newest N and every K-th step stay, and so do
# the one a tracker names, a pinned one and one with an open file; --dry-run deletes nothing; a
# deletion reaches another node through the backend. Runs in /usr/bin/python3 (Debian's PyTorch).
import os
import time

import pytest
import torch

from conftest import CKPTFS_BIN, run, wait_for, write_file


def retain(root, *args, check=True):
    return run([CKPTFS_BIN, "retain", root, *args], check=check)


def dirs(root):
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


def megatron_iteration(root, it, tp=2):
    d = root / f"iter_{it:07d}"
    for r in range(tp):
        (d / f"mp_rank_{r:02d}").mkdir(parents=True)
        torch.save({"iteration": it, "model": {"w": torch.full((4,), float(it))}},
                   d / f"mp_rank_{r:02d}" / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(it))


def deepspeed_step(root, step):
    d = root / f"global_step{step}"
    d.mkdir()
    torch.save({"module": {"w": torch.zeros(4)}}, d / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (root / "latest").write_text(f"global_step{step}")


@pytest.mark.timeout(120)
def test_megatron_keeps_the_newest_and_the_tracked_iteration(mnt):
    root = mnt / "run"
    root.mkdir()
    for it in (10, 20, 30, 40, 50):
        megatron_iteration(root, it)
    (root / "latest_checkpointed_iteration.txt").write_text("20")  # a job rolled back to 20

    p = retain(root, "--keep-last", "2", "--dry-run")
    assert "would delete iter_0000010" in p.stdout and "would delete iter_0000030" in p.stdout
    assert dirs(root) == [f"iter_{i:07d}" for i in (10, 20, 30, 40, 50)]  # nothing deleted

    os.setxattr(mnt.mnt, "user.ckptfs.seal", b"1")  # staged files into chunks
    chunks_before = mnt.chunks_on_disk()  # chunk files and pack extents
    p = retain(root, "--keep-last", "2")
    assert dirs(root) == ["iter_0000020", "iter_0000040", "iter_0000050"], p.stdout
    # The local tier drops the chunks only the deleted iterations held.
    assert wait_for(mnt.chunks_on_disk, lambda n: n < chunks_before, 30) < chunks_before
    assert "named by a tracker file" in p.stdout
    assert torch.load(root / "iter_0000020" / "mp_rank_01" / "model_optim_rng.pt")["iteration"] == 20


@pytest.mark.timeout(120)
def test_deepspeed_keeps_every_kth_step_and_the_latest_tag(mnt):
    root = mnt / "ds"
    root.mkdir()
    for step in (100, 200, 300, 400, 500, 600):
        deepspeed_step(root, step)
    (root / "latest").write_text("global_step300\n")
    retain(root, "--keep-last", "1", "--keep-every", "200")
    # 600 newest (and a multiple of 200), 200 and 400 every 200th, 300 named by `latest`.
    assert dirs(root) == ["global_step200", "global_step300", "global_step400", "global_step600"]
    assert (root / "latest").read_text() == "global_step300\n"  # files of ROOT are never touched


@pytest.mark.timeout(120)
def test_dcp_steps_skip_pinned_open_and_unrecognized_directories(mnt):
    root = mnt / "dcp"
    root.mkdir()
    for s in (1, 2, 3, 4, 5):
        d = root / f"step_{s}"
        d.mkdir()
        write_file(d / ".metadata", b"m" * 64)
        write_file(d / "__0_0.distcp", os.urandom(4096))
    (root / "logs").mkdir()  # not a checkpoint: never touched
    os.setxattr(root / "step_2", "user.ckptfs.pin", b"1")
    with open(root / "step_3" / "__0_0.distcp", "rb"):  # a reader (or a writer) has it open
        assert os.getxattr(root / "step_3", "user.ckptfs.busy") == b"1"
        p = retain(root, "--keep-last", "1")
    assert dirs(root) == ["logs", "step_2", "step_3", "step_5"], p.stdout
    assert "pinned" in p.stdout and "a file in it is open" in p.stdout
    assert os.getxattr(root / "step_3", "user.ckptfs.busy") == b"0"
    retain(root, "--keep-last", "1")  # closed now: it goes
    assert dirs(root) == ["logs", "step_2", "step_5"]


@pytest.mark.timeout(120)
def test_plain_directories_go_oldest_first(mnt):
    root = mnt / "plain"
    root.mkdir()
    now = time.time()
    for i, name in enumerate(["b", "c", "a"]):  # modification order b, c, a
        (root / name).mkdir()
        write_file(root / name / "x.bin", b"x")
        os.utime(root / name, (now - 100 + i, now - 100 + i))
    retain(root, "--keep-last", "1")
    assert dirs(root) == ["a"]


def test_bad_arguments_and_paths_outside_a_mount(mnt, tmp_path):
    assert retain(mnt, check=False).returncode == 2  # --keep-last is required
    assert retain(mnt, "--keep-last", "x", check=False).returncode == 2
    p = retain(tmp_path, "--keep-last", "1", check=False)
    assert p.returncode == 2 and "not a directory in a ckptfs mount" in p.stderr


@pytest.mark.timeout(300)
def test_a_deletion_reaches_the_other_nodes(make_mount, workdir):
    backend = workdir / "backend"
    backend.mkdir()
    a = make_mount(name="a", args=["--backend", f"file://{backend}"])
    b = make_mount(name="b", args=["--backend", f"file://{backend}"])
    root = a / "run"
    root.mkdir()
    for it in (1, 2, 3):
        megatron_iteration(root, it, tp=1)
    seen = b / "run" / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt"
    assert wait_for(lambda: os.path.exists(seen), bool, 60)
    retain(root, "--keep-last", "1")
    assert wait_for(lambda: dirs(b / "run"), lambda d: d == ["iter_0000003"], 60) == \
        ["iter_0000003"]
    assert torch.load(seen)["iteration"] == 3


@pytest.mark.timeout(180)
def test_the_retain_attribute_applies_the_policy_after_each_checkpoint(mnt):
    root = mnt / "run"
    root.mkdir()
    with pytest.raises(OSError) as bad:
        os.setxattr(root, "user.ckptfs.retain", b"keep_last=zero")
    assert bad.value.errno == 22  # EINVAL: nothing stored
    with pytest.raises(OSError):
        os.getxattr(root, "user.ckptfs.retain")
    os.setxattr(root, "user.ckptfs.retain", b"keep_last=2,keep_every=4")
    assert os.getxattr(root, "user.ckptfs.retain") == b"keep_last=2,keep_every=4"

    # DeepSpeed: each step ends with its `latest` tag; every tag's commit runs the policy.
    deepspeed_step(root, 1)
    deepspeed_step(root, 2)
    os.setxattr(root / "global_step2", "user.ckptfs.pin", b"1")
    for step in range(3, 8):
        deepspeed_step(root, step)
        want = {f"global_step{s}" for s in range(1, step + 1)
                if s >= step - 1 or s % 4 == 0 or s == 2}
        assert wait_for(lambda: set(dirs(root)), lambda d: d == want, 30) == want, step
    # An open file keeps its step until a later pass.
    f = open(root / "global_step7" / "mp_rank_00_model_states.pt", "rb")
    try:
        deepspeed_step(root, 8)
        deepspeed_step(root, 9)
        want = {"global_step2", "global_step4", "global_step7", "global_step8", "global_step9"}
        assert wait_for(lambda: set(dirs(root)), lambda d: d == want, 30) == want
    finally:
        f.close()
    deepspeed_step(root, 10)
    want = {"global_step2", "global_step4", "global_step8", "global_step9", "global_step10"}
    assert wait_for(lambda: set(dirs(root)), lambda d: d == want, 30) == want

    # DCP: a step counts once its .metadata (written last) commits.
    dcp = mnt / "dcp"
    dcp.mkdir()
    os.setxattr(dcp, "user.ckptfs.retain", b"keep_last=1")
    for step in (10, 20, 30):
        d = dcp / f"step_{step}"
        d.mkdir()
        write_file(d / "__0_0.distcp", os.urandom(4096))
        write_file(d / ".metadata", b"meta")
    assert wait_for(lambda: dirs(dcp), lambda d: d == ["step_30"], 30) == ["step_30"]
    # Only recognized checkpoints go unattended: custom tags, logs and configs stay.
    custom = mnt / "custom"
    custom.mkdir()
    os.setxattr(custom, "user.ckptfs.retain", b"keep_last=1")
    for tag in ("epoch1", "epoch2", "tensorboard"):
        (custom / tag).mkdir()
        write_file(custom / tag / "f.bin", os.urandom(1024))
        (custom / "latest").write_text(tag)
    time.sleep(1)
    assert dirs(custom) == ["epoch1", "epoch2", "tensorboard"]
    # Without the attribute nothing is deleted.
    os.removexattr(dcp, "user.ckptfs.retain")
    for step in (40, 50):
        (dcp / f"step_{step}").mkdir()
        write_file(dcp / f"step_{step}" / ".metadata", b"meta")
    time.sleep(1)
    assert dirs(dcp) == ["step_30", "step_40", "step_50"]


def test_progress_is_drawn_on_a_terminal_only(mnt):
    """retain and fsck draw progress on a terminal (here a pseudo-terminal from script(1)) and
    write none of it when stderr is a pipe."""
    root = mnt / "steps"
    root.mkdir()
    now = time.time()
    for i in range(3):
        d = root / f"s{i}"
        d.mkdir()
        for j in range(30):
            write_file(d / f"f{j}", b"x")
        os.utime(d, (now - 100 + i, now - 100 + i))
    r = run(["script", "-qec", f"{CKPTFS_BIN} retain {root} --keep-last 2", "/dev/null"])
    assert "ckptfs retain: deleting s0: 1 of 30" in r.stdout
    assert dirs(root) == ["s1", "s2"]
    r = retain(root, "--keep-last", "1")
    assert "deleting s1:" not in r.stderr and "\r" not in r.stderr
    assert dirs(root) == ["s2"]
    r = run(["script", "-qec", f"{CKPTFS_BIN} fsck {root}", "/dev/null"])
    assert "clean" in r.stdout
