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

// `ckptfs SOURCE MOUNTPOINT [-o OPTS]...` as mount.fuse3 runs it: the arguments of the
// equivalent `ckptfs mount`, or an empty vector when `args` is not that form (SOURCE must not
// be a command; MOUNTPOINT must be a directory). SOURCE is a backend URL when it has "://",
// else only a label ("ckptfs").
std::vector<std::string> MountHelperArgs(const std::vector<std::string>& args);

}  // namespace ckptfs
