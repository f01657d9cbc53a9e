// The ckptfs subcommands that only read: each takes the arguments after its name and returns the
// process exit status, printing errors to stderr.
#pragma once

#include <string>
#include <vector>

namespace ckptfs {

// ckptfs stats MOUNTPOINT|CACHE_DIR|PATH: logical vs stored bytes and the dedup ratio, for the
// whole store and per directory (read from the metadata, read-only, while the daemon runs).
int Stats(const std::vector<std::string>& args);
// ckptfs inspect [--json] FILE|DIR: a file's format, tensors, chunks and how much is shared (from
// the mount's computed attributes); a directory's checkpoint layout.
int Inspect(const std::vector<std::string>& args);

int Fail(const std::string& msg);

}  // namespace ckptfs
