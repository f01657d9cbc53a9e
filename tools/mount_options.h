// The mount command line: `ckptfs mount MOUNTPOINT [--cache-dir DIR] [--backend URL]... -o ...`,
// the same options in a file (-o config=FILE), and the form mount(8) uses through the fuse3
// package's mount helper for an fstab line of type fuse.ckptfs: `ckptfs SOURCE MOUNTPOINT -o ...`.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace ckptfs {

// Fills cfg from `args` (what follows `ckptfs mount`) and validates it.
Status ParseMountArgs(const std::vector<std::string>& args, Config& cfg);

// The arguments of the `ckptfs mount` that `SOURCE MOUNTPOINT [-o OPTS]...` asks for, or an empty
// vector when `args` is not that form (MOUNTPOINT must be a directory). `helper`: run as
// mount.fuse.ckptfs by mount(8), where SOURCE is any label; else (mount.fuse3 running `ckptfs
// SOURCE MOUNTPOINT -o ...`) SOURCE must be "ckptfs" or a URL. A SOURCE with "://" is a backend,
// the farthest (after any backend= option).
std::vector<std::string> MountHelperArgs(const std::vector<std::string>& args, bool helper);

}  // namespace ckptfs
