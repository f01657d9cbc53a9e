// RetentionPass: the daemon's passes of user.ckptfs.retain on a run directory
// ("keep_last=N[,keep_every=K]"), the policy of `ckptfs retain` applied each time a checkpoint
// under it completes here. A checkpoint counts as complete when its tracker file
// (latest_checkpointed_iteration.txt, latest, latest_universal) in the run directory is
// committed, or a DCP .metadata (written last) in one of its step directories. Only directories
// of a recognized layout (iter_*, global_step*, DCP steps) are ever deleted by it. The deletions
// go through the namespace like a user's (published to every tier, seen by every node). Never
// deleted: what the policy keeps, the checkpoint a tracker names, a pinned one
// (user.ckptfs.pin on it or in it), one with an open file.
//
// It reads metadata from LMDB and tracker bytes from the local tier itself; what changes the
// namespace it asks of the store above it through `Ops`, which the store sets at construction
// (commits notify the pass; the pass never names the Store).
//
// Thread-safe. mu_ guards pending_ and pool_; stopped_ is atomic and set under mu_. mu_ is a
// leaf: held only to queue a pass or to stop, never across a call out. NoteCommitted may be
// called with any store lock held (it reads LMDB and takes mu_). A pass runs on the pool's one
// thread with no lock of its own held and calls Ops from there, so Ops may take any store lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/local_chunks.h"
#include "store/meta_store.h"
#include "store/prefetcher.h"

namespace ckptfs {

class RetentionPass {
 public:
  // On a run directory: "keep_last=N[,keep_every=K]", applied after each checkpoint commits.
  static constexpr std::string_view kRetainXattr = "user.ckptfs.retain";

  // What a pass asks of the namespace above it. Each is called with no lock of the pass held.
  struct Ops {
    std::function<Result<InodeRecord>(uint64_t parent, std::string_view name)> lookup;
    std::function<Status(uint64_t parent, std::string_view name)> unlink;
    std::function<Status(uint64_t parent, std::string_view name)> rmdir;
    // Whether ino, or a file under it, is open now.
    std::function<Result<bool>(uint64_t ino)> busy;
    // Seals what is staged for ino, so that its manifest holds its bytes.
    std::function<Status(uint64_t ino)> ensure_sealed;
    // parent/name is gone: the kernel drops what it cached of it.
    std::function<void(uint64_t parent, const std::string& name)> forget;
  };

  // meta and chunks outlive this. Passes run on one thread of its own.
  RetentionPass(MetaStore* meta, LocalChunks* chunks, Logger log, Ops ops);
  // Stop()s.
  ~RetentionPass();
  RetentionPass(const RetentionPass&) = delete;
  RetentionPass& operator=(const RetentionPass&) = delete;

  // File ino was committed: when it completes a checkpoint of a run directory carrying
  // kRetainXattr, queues a pass over that directory (once while one is queued). Returns at once.
  void NoteCommitted(uint64_t ino);
  // One pass over run directory `root` now, on the caller's thread (ok when it carries no
  // kRetainXattr).
  Status Apply(uint64_t root);
  // The running pass ends first; queued ones are dropped and none is queued afterwards; a pass
  // still running tells the kernel nothing more. Idempotent.
  void Stop();

 private:
  Result<std::string> ReadSmallFile(uint64_t ino);  // a tracker file's bytes (at most 4 KiB)
  Result<bool> Pinned(uint64_t ino);  // Prefetcher::kPinXattr on ino or anything under it
  Status RemoveTree(uint64_t parent, const std::string& name);

  MetaStore* const meta_;
  LocalChunks* const chunks_;
  Logger log_;
  const Ops ops_;
  Mutex mu_;
  std::set<uint64_t> pending_ GUARDED_BY(mu_);  // run directories with a pass queued
  std::unique_ptr<ThreadPool> pool_ GUARDED_BY(mu_);  // one thread; reset by Stop
  std::atomic<bool> stopped_{false};
};

}  // namespace ckptfs
