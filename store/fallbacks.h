// Fallbacks: the versions files go back to after a machine crash (see FallbackRecord in
// store/meta_store.h), and the settle thread that makes the newest versions durable and drops
// their fallbacks.
//
// A commit without fsync makes the new manifest durable (LMDB syncs its commits) while the new
// chunks may still sit in the page cache. So such a commit keeps the version it replaces as the
// file's fallback (Cover); a rename over a file keeps the replaced file's durable version
// (FallBackToReplaced); recovery after a machine crash serves the fallback of each file whose
// newest version lost a chunk (Recover); Settle syncs the newest versions' chunk files every
// settle_interval and drops their fallbacks, and fsync drops its file's (DropSettled).
//
// The fallback records live in LMDB; what this class owns is the touch counter that tells a
// record changed since it was read, and the settle thread.
//
// Thread-safe. Which lock guards what:
//   ns_mu_      the namespace lock (a reference to Namespace's mu_, store/namespace.h, whose
//               Namespace owns this): every change of a fallback record. The txn functions
//               (Cover, FallBackToReplaced, Drop, Recover) run inside the caller's LMDB write
//               transaction, and their caller holds it (REQUIRES: ns_mu_ held, written on each:
//               clang cannot tell this reference and Namespace's mu_ are one lock). Settle and
//               DropSettled take it themselves.
//   settle_mu_  settle_stop_ (the settle thread's stop request). A leaf, held only to read or set
//               the flag; never held across a Settle.
//   touch_      atomic.
// Lock order: ns_mu_ -> the LMDB writer -> ChunkCache's lock (Recover's Verify), as in the store
// (store/store.h). Settle and DropSettled run with no store lock held by their caller other than
// a file's mu (fsync): they take ns_mu_, and sync chunk files and reclaim chunks (LocalChunks'
// holds_mu_, an LMDB sync) with ns_mu_ released.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "store/local_chunks.h"
#include "store/manifest.h"
#include "store/meta_store.h"

namespace ckptfs {

class Fallbacks {
 public:
  // meta, cache, chunks and ns_mu outlive this. boot_id: this boot's (the newest versions made
  // now are lost with its page cache). settle_interval_s: how often the settle thread runs
  // (none when 0).
  Fallbacks(MetaStore* meta, ChunkCache* cache, LocalChunks* chunks, Mutex& ns_mu, Logger log,
            std::string boot_id, double settle_interval_s);
  // Stops the settle thread if it runs.
  ~Fallbacks();
  Fallbacks(const Fallbacks&) = delete;
  Fallbacks& operator=(const Fallbacks&) = delete;

  // REQUIRES: ns_mu_ held, inside txn. A commit replaces `old` (rec: the inode before it): a
  // non-durable one keeps `old` as the file's fallback unless it has one already (true: old's
  // references now belong to the fallback); a durable one drops the fallback.
  Result<bool> Cover(MetaStore::Txn& txn, const InodeRecord& rec,
                     const std::optional<Manifest>& old, bool durable, std::vector<ChunkId>* freed);
  // REQUIRES: inside txn. Whether ino's newest version may not be durable yet: it has a
  // fallback, or it is a staged record written without fsync.
  static Result<bool> AtRisk(MetaStore::Txn& txn, uint64_t ino);
  // REQUIRES: ns_mu_ held, inside txn. A rename puts `src` in place of `dst` (a regular file
  // about to lose that name): when src's newest version may not be durable (a fallback, or a
  // staged record without fsync), src's fallback becomes dst's last durable version.
  Status FallBackToReplaced(MetaStore::Txn& txn, const InodeRecord& src, const InodeRecord& dst,
                            std::vector<ChunkId>* freed);
  // REQUIRES: inside txn (a write transaction of a namespace change: ns_mu_ held). Drops ino's
  // fallback and its references.
  Status Drop(MetaStore::Txn& txn, uint64_t ino, std::vector<ChunkId>* freed);

  // What recovery asks of the rest of the store; each runs inside Recover's txn, with ns_mu_
  // held (Store::Recover passes them).
  struct RecoverHooks {
    // The staging rule (Staging::StagedSurvives): a staged record's bytes survived the stop.
    std::function<bool(const StagedRecord&, bool clean)> staged_survives;
    // The path of the staging file named `name` (StagePath, store/staged_meta.h).
    std::function<std::string(const std::string& name)> stage_path;
    // Removes a new file's entry and inode (Namespace::RemoveUnborn).
    std::function<Status(MetaStore::Txn&, const InodeRecord&, std::vector<ChunkId>*)> remove_unborn;
    // Queues what the remote tiers must learn of a change (Namespace::QueueRemote).
    std::function<Status(MetaStore::Txn&, const std::string& op)> queue_remote;
  };
  // At open, before the staged records are recovered (REQUIRES: ns_mu_ held, inside txn): after
  // a clean stop every fallback goes (all was synced); after a crash of this boot they stay (the
  // page cache kept the bytes; Settle ends them); after a machine crash each file whose newest
  // version lost a chunk goes back to its fallback, the others keep what they have.
  Status Recover(MetaStore::Txn& txn, bool clean, const RecoverHooks& hooks,
                 std::vector<ChunkId>* freed);

  // Makes durable the newest version of every file committed without fsync (an fsync of each of
  // its chunk files, not of the whole disk), and drops the fallbacks that covered them
  // (Store::Settle). After a machine crash a file reads as its newest version whose chunks are
  // whole, or as the one before it that was durable (a version closed since then may be lost,
  // never torn or unreadable). Takes ns_mu_.
  Status Settle() EXCLUDES(ns_mu_);
  // Drops the fallbacks in `covered` (ino, touch) still as they were, whose newest versions
  // were synced since they were read. Takes ns_mu_ (REQUIRES: not held), then reclaims the
  // chunks freed with it released.
  Status DropSettled(const std::vector<std::pair<uint64_t, uint64_t>>& covered) EXCLUDES(ns_mu_);

  // Starts the settle thread (Settle every settle_interval; nothing when it is 0). Once, when
  // the store is open.
  void Start();
  // Stops the settle thread and waits for a Settle running to end. Idempotent.
  void Stop();

 private:
  // The settle thread's loop: Settle every settle_interval until Stop.
  void SettleLoop();
  uint64_t NextTouch() { return touch_.fetch_add(1) + 1; }

  MetaStore* const meta_;
  ChunkCache* const cache_;
  LocalChunks* const chunks_;
  Mutex& ns_mu_;
  const Logger log_;
  const std::string boot_id_;
  const double settle_interval_s_;
  // Fallback touches: unique across the daemons that use this store (seeded by the clock).
  std::atomic<uint64_t> touch_;
  Mutex settle_mu_;
  std::condition_variable settle_cv_;
  bool settle_stop_ GUARDED_BY(settle_mu_) = false;
  // Last: joined (Stop) before anything it uses goes.
  std::thread settle_thread_;
};

}  // namespace ckptfs
