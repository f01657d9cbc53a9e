// What every part of the store knows of staged files (written in passthrough mode, see
// store/store.h) without the staging component: where a staging file lives, how its staged
// record shows in the inode's attributes, and the clocks and stat fields the records hold.
// Free functions over their arguments; no state, no locks.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "store/meta_store.h"

namespace ckptfs {

// The staging file named `name` (StagedRecord::name) of the cache directory `cache_dir`.
std::string StagePath(const std::string& cache_dir, const std::string& name);

// REQUIRES: inside txn. Shows a staged file's size, stored bytes and time in rec (what stat
// reports; the inode record keeps the last sealed version's).
Status OverlayStaged(MetaStore::Txn& txn, InodeRecord* rec);

// Wall-clock time in nanoseconds since the epoch.
int64_t NowNs();
// This boot's id (/proc/sys/kernel/random/boot_id; $CKPTFS_BOOT_ID instead when set, for tests
// that stand for a machine crash by restarting on a copy of the disk).
std::string CurrentBootId();
// A staging file's modification time, and the bytes it holds (st_blocks; at most its size).
int64_t MtimeNs(const struct stat& st);
uint64_t DataBytes(const struct stat& st);

}  // namespace ckptfs
