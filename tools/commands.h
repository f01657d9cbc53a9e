// The ckptfs subcommands besides mount and umount: each takes the arguments after its name and
// returns the process exit status, printing errors to stderr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "common/status.h"

namespace ckptfs {

// ckptfs stats MOUNTPOINT|CACHE_DIR|PATH: logical vs stored bytes and the dedup ratio, for the
// whole store and per directory (read from the metadata, read-only, while the daemon runs).
int Stats(const std::vector<std::string>& args);
// ckptfs inspect [--json] FILE|DIR: a file's format, tensors, chunks and how much is shared (from
// the mount's computed attributes); a directory's checkpoint layout.
int Inspect(const std::vector<std::string>& args);
// ckptfs prefetch PATH [--wait]: pulls a file or tree onto the local tier in the background (sets
// user.ckptfs.prefetch); --wait follows user.ckptfs.cached with a progress bar until it is all
// there (exit 0), the prefetch ends short of it (1) or it is interrupted (130, cancelled).
int Prefetch(const std::vector<std::string>& args);

// ckptfs fsck [PATH] [--deep] [--repair] [--json]: the daemon's check of the files under PATH
// (Store::Fsck); exit 0 clean, 1 damage remains, 2 the check could not run.
int Fsck(const std::vector<std::string>& args);

// ckptfs retain ROOT --keep-last N [--keep-every K] [--dry-run]: deletes old checkpoints under
// ROOT through the mount (tools/retain.cc says which are kept).
int Retain(const std::vector<std::string>& args);

// ckptfs gc --backend URL [--s3-endpoint URL] (--dry-run | --grace DURATION): counts, or
// deletes in a round, the backend's chunks no file record references (docs/gc.md).
int Gc(const std::vector<std::string>& args);

// ckptfs snapshot --backend URL [--s3-endpoint URL] [--keep N] [--part-size MIB]: writes a record
// snapshot of the backend's namespace for new mounts (store/snapshot.h, docs/journal.md).
int Snapshot(const std::vector<std::string>& args);
// Writes one and prints what it wrote (ckptfs snapshot, ckptfs gc); *journal (optional): its
// journal entry.
Status WriteSnapshot(Backend& b, size_t keep, uint64_t part_bytes, uint64_t* journal);

// ckptfs status [MOUNTPOINT|PATH] [--json]: the daemon's pid, version, uptime, options, tiers and
// their health, local tier use, what waits for upload, recent errors.
int ShowStatus(const std::vector<std::string>& args);

// Where a view is read from without a mount: a plain directory, or an unmounted cache directory
// (--cache-dir) with the remote tiers that hold its evicted chunks (--backend URL, repeated
// nearest first; --s3-endpoint URL for the s3:// ones).
struct OfflineFrom {
  std::string cache_dir;
  std::vector<std::string> backends;
  std::string s3_endpoint;
  // Takes the option at args[*i] (and its value) when it is one of these three: true, *i on its
  // value. False for any other argument.
  bool Parse(const std::vector<std::string>& args, size_t* i);
};

// ckptfs convert SRC DST --view SPEC [--cache-dir DIR [--backend URL]...] [--rules FILE]: writes
// view SPEC of the checkpoint in directory SRC (plain, a mount's path, or with --cache-dir a
// directory of that unmounted cache directory) into the new directory DST without a mount
// (tools/convert.cc).
int Convert(const std::vector<std::string>& args);
// ckptfs inspect ROOT --view SPEC [--cache-dir DIR [--backend URL]...] off a mount: the view's
// files, sizes and the source files each reads, planned without a daemon.
int InspectViewOffline(const std::string& root, const std::string& spec,
                       const OfflineFrom& from = {});

int Fail(const std::string& msg);
// The torch_dist iterations in directory `path` (itself, or its iter_* directories), described
// for `ckptfs inspect`: backend, parallel sizes, model, sharded tensors. "" when there are none.
std::string DescribeTorchDist(const std::string& path);
// The largest attribute value the daemon answers with (the kernel's limit): the reports of
// fsck and status are read into a buffer this size.
inline constexpr size_t kMaxXattrValue = 64 * 1024;
// The exit status of every command given bad arguments (an unknown option, a missing value);
// 1 is a command that could not do its work, 0 success.
inline constexpr int kExitUsage = 2;
// "1.5 GiB": bytes in powers of 1024, one decimal (none for plain bytes).
std::string HumanBytes(double bytes);

}  // namespace ckptfs
