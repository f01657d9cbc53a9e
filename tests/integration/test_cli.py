# The command line: every command answers --help, bad usage exits 2, --version.
import subprocess

import pytest

from conftest import CKPTFS_BIN

COMMANDS = ["mount", "umount", "status", "stats", "inspect", "prefetch", "fsck", "retain", "gc",
            "snapshot"]


def ckptfs(*args):
    return subprocess.run([str(CKPTFS_BIN), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_answers_help(cmd):
    for flag in ("--help", "-h"):
        r = ckptfs(cmd, flag)
        assert r.returncode == 0, r.stderr
        assert f"ckptfs {cmd}" in r.stdout
        assert "usage" in r.stdout.lower()
        assert "Exit status" in r.stdout


@pytest.mark.parametrize("cmd", ["mount", "umount", "status", "prefetch", "fsck", "retain", "gc",
                                 "snapshot"])
def test_an_unknown_option_is_a_usage_error(cmd):
    r = ckptfs(cmd, "/tmp", "--no-such-option")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--no-such-option" in r.stderr or "usage" in r.stderr.lower()


def test_version_and_top_level_help():
    r = ckptfs("--version")
    assert r.returncode == 0 and r.stdout.startswith("ckptfs ")
    r = ckptfs("--help")
    assert r.returncode == 0 and "ckptfs mount MOUNTPOINT" in r.stdout
    r = ckptfs()
    assert r.returncode == 2 and "usage" in r.stderr
    r = ckptfs("frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr
