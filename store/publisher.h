// Publisher: the store's side of the remote tiers (store/remote_tier.h). It owns the chain of
// backends, nearest first, and one RemoteTier per backend, which works off that tier's queue of
// ops in LMDB; it queues the ops that namespace changes and commits must publish, keeps the
// chunks of versions not yet published on the local tier (HoldUnpublished), puts back into a
// nearer tier the chunks a read found missing there (RestoreNearer), and says what each tier
// holds of a file (RemoteState, TierStates). It also owns the namespace's journal in the
// farthest tier (store/journal.h), which that tier appends to and the namespace sync reads.
// Applying what other nodes published is the store's namespace sync (store/namespace_sync.h).
//
// Thread-safe once Attach returned. Which lock guards what:
//   unpublished_mu_  unpublished_ (the versions whose chunks are held until every tier has them).
//   restore_mu_      restore_bytes_ and restore_pool_ (the restores queued, and their thread).
//   backends_, remotes_, node_id_ and journal_ are set in Attach, before any other call, and
//   not changed after; stopping_ is atomic.
// Lock order: both locks are leaves among the store's locks. Callers may hold any store lock
// (OpenFile::mu, the namespace lock, store/namespace.h) when they call in. Under unpublished_mu_
// nothing else is taken (ChunkCache::Hold and Unhold run outside it); under restore_mu_ only a
// restore is queued. No lock of the Publisher is held across a backend request or an LMDB
// transaction. RemoteTier's own lock is a leaf too (Kick).
//
// The store's namespace lock: the ops of a namespace change are queued inside the change's own
// write transaction (Queue, QueueTree, QueueUnpublished), so that its commit makes them durable
// with the change; the caller holds the namespace lock across that transaction, as every
// namespace write does. The Publisher itself never takes it. Its other LMDB writes (the tier
// policy's marks, Attach's tier names) are made without it, as RemoteTier's are.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/journal.h"
#include "store/manifest.h"
#include "store/meta_store.h"
#include "store/remote_tier.h"

namespace ckptfs {

class Publisher {
 public:
  // cfg, meta, cache and metrics outlive this. Without Attach there are no remote tiers: the
  // queueing calls do nothing and every file is "local".
  Publisher(const Config& cfg, MetaStore* meta, ChunkCache* cache, Metrics* metrics, Logger log);
  // Joins the restore thread and stops the tiers' workers (Close stops them first).
  ~Publisher() = default;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Takes the chain of remote tiers (nearest first, at most kMaxTiers): moves each tier's state
  // in LMDB to where its backend stands in the chain now, hands the chain to the chunk cache,
  // and makes the tiers (not started), every request of each timed (TimedBackend). Once, at
  // open, before QueueUnpublished and Start.
  Status Attach(std::vector<std::unique_ptr<Backend>> tiers);
  // At open, after Attach: queues every file whose committed version a tier does not hold, and
  // holds its chunks. REQUIRES: the caller holds the namespace lock (the transaction is one of
  // the namespace's writes).
  Status QueueUnpublished();
  // Starts the tiers' workers on their queues.
  void Start();

  // Close's steps, in this order. BeginStop: restores from now on put nothing (a later read asks
  // again). StopRestores: the restores queued and not begun are dropped, the one running ends
  // first. StopTiers: each tier finishes the op in flight and stops; the rest stay queued in
  // LMDB for the next mount.
  void BeginStop() { stopping_ = true; }
  void StopRestores();
  void StopTiers();

  // Remote tier `tier` (nearest first); null without one.
  RemoteTier* remote(size_t tier = 0) {
    return tier < remotes_.size() ? remotes_[tier].get() : nullptr;
  }
  size_t tiers() const { return remotes_.size(); }
  // The backend of tier `tier` (the one its RemoteTier writes to). REQUIRES: tier < tiers().
  Backend& backend(size_t tier) { return *backends_[tier]; }
  // The tier other nodes' files are synced from: the farthest. REQUIRES: remote tiers.
  RemoteTier& sync_tier() { return *remotes_.back(); }
  Backend& sync_backend() { return *backends_.back(); }
  // The namespace's journal in the farthest tier (null without remote tiers). The namespace sync
  // reads it.
  NamespaceJournal* journal() { return journal_.get(); }
  // This node's name in published records (empty without remote tiers).
  const std::string& node_id() const { return node_id_; }

  // REQUIRES: inside a write txn, the caller holding the namespace lock. Queues `op` for every
  // tier (nothing without remote tiers); the txn's commit makes it durable with the change.
  Status Queue(MetaStore::Txn& txn, const std::string& op);
  // REQUIRES: as Queue. Queues, for ino and everything under it, the unpublishing of its old
  // paths (publish=false, `path` its path now) or the publishing under its new ones
  // (publish=true).
  Status QueueTree(MetaStore::Txn& txn, uint64_t ino, const std::string& path, bool publish);
  // Ops were queued: wakes every tier's worker.
  void Kick();

  // The chunks of a file committed here stay unevictable until its generation is in every tier
  // (ChunkCache::Hold); released by the tiers' publishes of the file (ReleaseUnpublished).
  void HoldUnpublished(uint64_t ino, uint64_t generation, const Manifest& m);
  void ReleaseUnpublished(uint64_t ino);

  // The file's state as user.ckptfs.state shows it: "local" (no backend, or bytes not
  // committed yet), "uploading" (committed, a remote tier does not hold this version yet) or
  // "remote" (every tier holds it); and as user.ckptfs.tiers does, per tier, nearest first:
  // {"tiers":[{"backend":URL,"state":S},...]}, S one of "local", "uploading", "remote", or
  // "dropped" (past that tier's keep= policy). `dirty`: the file has bytes not yet committed,
  // taken before this call reads LMDB.
  Result<std::string> RemoteState(uint64_t ino, bool dirty);
  Result<std::string> TierStates(uint64_t ino, bool dirty);

 private:
  // Each tier's state of file ino, nearest first (empty without remote tiers).
  Result<std::vector<std::string>> StatesOf(uint64_t ino, bool dirty);
  // A read fetched chunk `id` from a farther tier while the nearer tiers in `missing` had none.
  void RestoreNearer(const ChunkId& id, uint8_t missing, const ChunkRef& data);

  const Config& cfg_;
  MetaStore* const meta_;
  ChunkCache* const cache_;
  Metrics* const metrics_;
  const Logger log_;
  std::vector<std::unique_ptr<Backend>> backends_;  // the remote tiers' backends, nearest first
  std::string node_id_;  // this node's name in published records
  // The namespace's journal (store/journal.h) in the farthest tier.
  std::unique_ptr<NamespaceJournal> journal_;
  // Set at Close (BeginStop): restores end at once.
  std::atomic<bool> stopping_{false};
  Mutex unpublished_mu_;
  // ino -> each version held: its generation and the chunk ids it names (sorted, distinct).
  // Versions stay until one at least as new is published (a commit whose transaction failed
  // leaves its entry; the version before it keeps its own).
  std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, std::vector<ChunkId>>>>
      unpublished_ GUARDED_BY(unpublished_mu_);
  // Chunks a read found missing from a nearer tier that this node counted as holding them, put
  // back there (RestoreNearer): one thread, at most kMaxRestoreBytes queued.
  static constexpr uint64_t kMaxRestoreBytes = 64ull << 20;
  Mutex restore_mu_;
  uint64_t restore_bytes_ GUARDED_BY(restore_mu_) = 0;
  std::unique_ptr<ThreadPool> restore_pool_ GUARDED_BY(restore_mu_);  // reset at StopRestores
  // Last: destroyed first, so the workers are stopped before what they use goes (the backends,
  // the journal, unpublished_ through their published listener).
  std::vector<std::unique_ptr<RemoteTier>> remotes_;  // one per backend, nearest first
};

}  // namespace ckptfs
