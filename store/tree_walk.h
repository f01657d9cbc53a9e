// Walks of the namespace in one LMDB transaction, shared by prefetch, fsck, the tier policies and
// retention. Free functions over MetaStore::Txn: they take no store lock and hold no state, so a
// read transaction (a consistent snapshot) serves them as well as a write transaction does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "store/manifest.h"
#include "store/meta_store.h"
#include "store/retention.h"

namespace ckptfs {

// Calls fn(ino, manifest) for file `ino`, or for every regular file under directory `ino` (all
// levels when `recursive`, else its own files), each inode once. A file with no manifest yet
// comes with an empty one; other kinds of inode than files and directories are skipped.
Status ForEachFile(MetaStore::Txn& txn, uint64_t ino, bool recursive,
                   const std::function<void(uint64_t, const Manifest&)>& fn);

// The subdirectories of `dir` as retention sees them (store/retention.h): name, inode, time and
// whether each holds a DCP .metadata.
Result<std::vector<CheckpointDir>> CheckpointDirsOf(MetaStore::Txn& txn, uint64_t dir);

// Adds to *out the checkpoint directories under `dir` (a run, or runs below it, up to a depth)
// that `policy` does not keep; *found_run: some run was found. `depth`: dir's depth below where
// the search began (0 there).
Status FindDropped(MetaStore::Txn& txn, uint64_t dir, const RetentionPolicy& policy, int depth,
                   bool* found_run, std::vector<uint64_t>* out);

// The path of parent/name, "" when the parent is not reachable from the root.
std::string ChildPath(MetaStore::Txn& txn, uint64_t parent, std::string_view name);

}  // namespace ckptfs
