# ckptfs status: the daemon's state as an operator reads it, in words and as JSON.
import json
import os

from conftest import CKPTFS_BIN, run, wait_for


def status(path, *flags, check=True):
    return run([CKPTFS_BIN, "status", path, *flags], check=check)


def status_json(path):
    return json.loads(status(path, "--json").stdout)


def test_status_of_a_healthy_mount(make_mount, workdir):
    remote = workdir / "remote"
    remote.mkdir()
    m = make_mount(options="ram_cache=64M", args=("--backend", f"file://{remote}"))
    (m.mnt / "d").mkdir()
    data = os.urandom(3 << 20)
    (m.mnt / "d" / "a.bin").write_bytes(data)
    os.setxattr(m.mnt, "user.ckptfs.seal", b"1")
    s = status_json(m.mnt / "d")  # any path inside the mount
    assert s["pid"] == m.daemon_pid()
    assert "ckptfs " + s["version"] == run([CKPTFS_BIN, "--version"]).stdout.strip()
    assert s["mountpoint"] == str(m.mnt) and s["cache_dir"] == str(m.cache)
    assert s["options"]["ram_cache"] == 64 << 20
    assert s["local_tier"]["bytes"] == len(data)
    assert len(s["tiers"]) == 1 and s["tiers"][0]["url"] == f"file://{remote}"
    s = wait_for(lambda: status_json(m.mnt), lambda s: s["tiers"][0]["waiting"] == 0)
    assert s["tiers"][0]["failing"] is False and s["local_tier"]["not_uploaded"] == 0
    assert s["recent_errors"] == []
    # The namespace sync follows the journal, which holds the directory and the file.
    assert s["options"]["warm"] == "checkpoint" and s["options"]["sync_full_interval_s"] == 600
    s = wait_for(lambda: status_json(m.mnt), lambda s: s["namespace_sync"]["journal_entry"] >= 2)
    assert s["namespace_sync"]["mode"] == "journal"
    text = status(m.mnt).stdout
    assert "namespace sync: the change journal, read up to entry" in text
    assert f"daemon pid {m.daemon_pid()}" in text
    assert f"tier 1 file://{remote}: ok, 0 files" in text
    assert "recent errors and warnings: none" in text


def test_status_shows_a_failing_tier_and_its_errors(make_mount, workdir):
    remote = workdir / "remote"
    remote.mkdir()
    m = make_mount(args=("--backend", f"file://{remote}", "--backend-faults", "fail=1,ops=put"))
    (m.mnt / "a.bin").write_bytes(os.urandom(1 << 20))
    s = wait_for(lambda: status_json(m.mnt), lambda s: s["tiers"][0]["failing"], timeout=30)
    tier = s["tiers"][0]
    assert tier["failing"] and "injected fault" in tier["last_error"]
    assert tier["waiting"] >= 1
    assert any("injected fault" in line for line in s["recent_errors"])
    assert s["local_tier"]["not_uploaded"] > 0
    text = status(m.mnt).stdout
    assert "retrying after: " in text and "recent errors and warnings (newest last):" in text


def test_status_outside_a_mount_and_bad_usage(workdir):
    r = status(workdir, check=False)
    assert r.returncode == 1 and "in no ckptfs mount" in r.stderr
    r = run([CKPTFS_BIN, "status", workdir, "--bogus"], check=False)
    assert r.returncode == 2


def test_status_keeps_warnings_below_the_log_level(make_mount, workdir):
    """A log that shows errors only: the tier's warnings are still in the status."""
    remote = workdir / "remote"
    remote.mkdir()
    m = make_mount(log_level="error",
                   args=("--backend", f"file://{remote}", "--backend-faults", "fail=1,ops=put"))
    (m.mnt / "a.bin").write_bytes(os.urandom(1 << 20))
    s = wait_for(lambda: status_json(m.mnt), lambda s: s["recent_errors"], timeout=30)
    assert any("injected fault" in line for line in s["recent_errors"])
    assert "[warning]" not in m.log()  # the log itself keeps its level


def test_the_status_attribute_is_reserved_and_links_are_followed(mnt, workdir):
    for op in (lambda: os.setxattr(mnt.mnt, "user.ckptfs.status", b"{}"),
               lambda: os.removexattr(mnt.mnt, "user.ckptfs.status")):
        try:
            op()
            raise AssertionError("user.ckptfs.status was changed")
        except PermissionError:
            pass
    link = workdir / "link"
    link.symlink_to(mnt.mnt)
    assert status_json(link)["mountpoint"] == str(mnt.mnt)


def test_an_infinite_time_option_is_refused(make_mount):
    m = make_mount(options="gc_window=inf", mount=False)
    r = run(m.mount_command(), check=False)
    assert r.returncode == 2 and "finite" in r.stderr
