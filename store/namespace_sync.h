// NamespaceSync: applying what other nodes published to the farthest remote tier (the namespace
// sync). A pass reads what changed in that tier's files/ and dirs/ trees, either from the
// namespace's change journal (store/journal.h, Publisher::journal()) after the entry it last read,
// or from a full listing of both trees (the first pass, every sync_full_interval, after a gap in
// the journal, and every pass when the backend's creates are not exclusive or
// sync_full_interval is 0), and applies each changed record to the local namespace in LMDB (a
// new mount reads the bucket's record snapshot and the journal after it instead of the listing,
// when there is one it can trust: store/snapshot.h): a
// file another node published, replaced or deleted, a directory made or removed. A file open
// here, with bytes staged here, or with local changes not yet published and newer than the
// remote version, is left alone (kBusy: tried again at a later pass). A thread runs a pass every
// sync_interval (Start/Stop); InitialSync runs the first before the mount serves.
//
// The namespace changes go through the store's LMDB like its own: each apply runs one write
// transaction under the store's namespace lock. What only the store above can do (drop an
// inode's last link, tell the kernel what changed) it asks through `Hooks`.
//
// Thread-safe. Which lock guards what:
//   pass_mu_  one pass (SyncFromRemote) at a time: held for the whole of each pass, by whichever
//             thread runs it (the sync thread, InitialSync before the mount serves, tests, the
//             sync bench), so that callers running passes at once wait for each other. It
//             guards what the passes have seen and must do again: synced_, journal_cursor_,
//             journal_exclusive_, journal_retry_, journal_retry_set_, journal_damaged_ and
//             last_full_sync_. (Before this class, only the convention that nothing calls
//             SyncFromRemote while the sync thread runs kept those apart.)
//   ns_mu_    the namespace lock (a reference to Namespace's mu_, not owned): taken by
//             each apply (ApplyRemote*) around its write transaction, never across a backend
//             request. MakeDirsForRemote runs inside such a transaction (REQUIRES: ns_mu_ held,
//             written in a comment: clang's analysis cannot tell this reference and
//             Namespace's mu_ are one lock).
//   stop_mu_  stop_ (the sync thread's stop request). A leaf, held only to read or set the flag
//             and for the thread's wait between passes; never held across a pass.
//   mode_, journal_entry_  atomic: what Store::gauges() shows.
// Lock order: pass_mu_ -> ns_mu_ -> the leaves (LMDB's writer, the open-file table's lock,
// Fallbacks::Drop inside the transaction, LocalChunks' holds_mu_ in Reclaim after it, the
// store's listener_mu_ in Hooks::tell_change after it). Nothing under pass_mu_ waits for another
// pass. Backend requests (listings, GETs, HEADs, the journal) are made with pass_mu_ held and
// ns_mu_ not held. Hooks::tell_change is called with no lock held but pass_mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "store/fallbacks.h"
#include "store/local_chunks.h"
#include "store/meta_store.h"
#include "store/open_table.h"
#include "store/publisher.h"
#include "store/remote_tier.h"

namespace ckptfs {

class NamespaceSync {
 public:
  // Told (done, total) as a pass goes: entries applied or found current, entries listed.
  using Progress = std::function<void(size_t done, size_t total)>;

  // What an apply asks of the store above it.
  struct Hooks {
    // REQUIRES: ns_mu_ held, inside txn (an apply's). Drops rec's last link: kept as an orphan
    // while open, otherwise deleted; chunks left unreferenced go into *freed (Namespace::DropLink).
    std::function<Status(MetaStore::Txn& txn, InodeRecord& rec, std::vector<ChunkId>* freed)>
        drop_link;
    // parent/name now names ino (0: nothing): the kernel drops what it cached of both
    // (Store::TellChange). Called with ns_mu_ released.
    std::function<void(uint64_t parent, const std::string& name, uint64_t ino)> tell_change;
  };

  // cfg, meta, publisher, files, cache, chunks, fallbacks and ns_mu outlive this. The remote
  // tiers may be attached to the publisher after construction; without them every call is a
  // no-op.
  NamespaceSync(const Config& cfg, MetaStore* meta, Publisher* publisher, OpenTable* files,
                ChunkCache* cache, LocalChunks* chunks, Fallbacks* fallbacks, Mutex& ns_mu,
                Logger log, Hooks hooks);
  // Stops the sync thread if it runs.
  ~NamespaceSync();
  NamespaceSync(const NamespaceSync&) = delete;
  NamespaceSync& operator=(const NamespaceSync&) = delete;

  // One pass: applies every file another node published, replaced or deleted since the last
  // pass. A file open here, or with local changes not yet published and newer than the remote
  // version, is left alone. `progress`, when given, is told (entries applied or found current,
  // entries listed) as the pass goes, at most every 256 entries. `listed` (optional): whether
  // the backend's listing succeeded (the errors returned then are of single entries). Waits
  // for a pass running on another thread to end first.
  Status SyncFromRemote(const Progress& progress, bool* listed) EXCLUDES(pass_mu_);
  // The first pass, before the mount serves: retried with backoff until it succeeds or
  // timeout_s has passed, so that a mount never serves a namespace that does not yet hold what
  // the backend held when it started (a job would find an empty checkpoint directory and start
  // from scratch). Ok at once without remote tiers. Entries that cannot be applied for good (a
  // name that is no file name, ...) are logged and do not hold the mount; a listing or a record
  // that cannot be read is retried. Errors: the last pass's, naming the backend.
  Status InitialSync(double timeout_s, const Progress& progress) EXCLUDES(pass_mu_);
  // Starts the thread that runs a pass every sync_interval (nothing without remote tiers, with
  // sync_interval 0, or when it runs already).
  void Start();
  // Stops the thread, waiting for a pass running to end; a thread started afterwards stops after
  // its first pass. Idempotent.
  void Stop();

  // For Store::gauges(): "journal" (the passes read the change journal), "listing" (every pass
  // lists the bucket), "" before the first pass; and the journal entry last read up to.
  std::string mode() const;
  uint64_t journal_entry() const { return journal_entry_.load(); }

 private:
  // The tier other nodes' files are synced from: the farthest. REQUIRES: remote tiers.
  RemoteTier& sync_tier() { return publisher_->sync_tier(); }
  Backend& sync_backend() { return publisher_->sync_backend(); }
  // The sync thread's loop: a pass every sync_interval until Stop.
  void Loop();
  // One full pass (a listing of files/ and dirs/), and one pass over the journal's new entries
  // (*gap: the entries after the cursor are gone; relist).
  Status FullSync(const Progress& progress, bool* listed) REQUIRES(pass_mu_);
  Status JournalSync(bool* gap) REQUIRES(pass_mu_);
  // Applies the keys of a batch read after the cursor (and those queued to retry), and moves the
  // cursor to its end.
  Status ApplyBatch(const NamespaceJournal::Batch& b) REQUIRES(pass_mu_);
  // A new mount's first pass from the bucket's newest record snapshot and the journal after it
  // (store/snapshot.h): the journal's batch after J is read first, the snapshot's keys it does
  // not name are applied, then the batch. *used false: there is none, or it cannot be trusted
  // (damaged, or the journal was truncated past it); no version noted from it is remembered
  // then, and the caller lists.
  Status SnapshotSync(const Progress& progress, bool* used) REQUIRES(pass_mu_);
  // Applies `key` as a listing or a snapshot found it at `version`, with its record's bytes
  // (files/ keys; `bytes` read after `gc_generation` was taken) and remembers the version in
  // synced_. Returns the error to report; the caller queues the key for the journal passes then.
  // Damaged records and files busy here are queued for them without an error.
  Status ApplySeen(const std::string& key, const std::string& version, Result<std::string> bytes,
                   uint64_t gc_generation) REQUIRES(pass_mu_);
  // Applies the bucket's current state of one key (files/<path> or dirs/<path>).
  Status SyncKey(const std::string& key) REQUIRES(pass_mu_);
  // Queues key for the journal passes to try again (once).
  void RetryKey(const std::string& key) REQUIRES(pass_mu_);
  // The applies: each one write transaction under ns_mu_ (taken here: REQUIRES not held).
  // `gc_generation`: RemoteTier::gc_generation() before the record was read; kNoMarks: the
  // record marks none of its chunks as held by the tier.
  static constexpr uint64_t kNoMarks = UINT64_MAX;
  Status ApplyRemoteFile(const std::string& path, const FileRecord& r, uint64_t gc_generation);
  Status ApplyRemoteDelete(const std::string& path);
  Status ApplyRemoteDir(const std::string& path);
  Status ApplyRemoteRmdir(const std::string& path);
  // REQUIRES: ns_mu_ held, inside a write txn. The directory at `dirs` (path components) below
  // the root, made where missing; kExists when a component is not a directory.
  Result<uint64_t> MakeDirsForRemote(MetaStore::Txn& txn, const std::vector<std::string>& dirs,
                                     std::vector<std::pair<uint64_t, std::string>>* created);

  const Config& cfg_;
  MetaStore* const meta_;
  Publisher* const publisher_;
  OpenTable* const files_;
  ChunkCache* const cache_;
  LocalChunks* const chunks_;
  Fallbacks* const fallbacks_;
  Mutex& ns_mu_;
  const Logger log_;
  const Hooks hooks_;

  // Held for each whole pass; guards what the passes keep between them.
  Mutex pass_mu_ ACQUIRED_BEFORE(ns_mu_);
  // For each files/<path> and dirs/<path> key, the object version seen.
  std::map<std::string, std::string> synced_ GUARDED_BY(pass_mu_);
  // Of the namespace's journal in the farthest tier: the entry the passes have read up to (none:
  // the next pass lists everything), keys whose application is to be tried again, and when the
  // last full listing was.
  std::optional<uint64_t> journal_cursor_ GUARDED_BY(pass_mu_);
  // The backend refuses a second create of one key (probed once).
  std::optional<bool> journal_exclusive_ GUARDED_BY(pass_mu_);
  std::vector<std::string> journal_retry_ GUARDED_BY(pass_mu_);  // in the order they failed, each once
  std::set<std::string> journal_retry_set_ GUARDED_BY(pass_mu_);  // the same keys, to find them
  std::set<std::string> journal_damaged_ GUARDED_BY(pass_mu_);  // damaged records already reported
  std::chrono::steady_clock::time_point last_full_sync_ GUARDED_BY(pass_mu_);
  // What gauges() shows: 0 no pass yet, 1 journal, 2 listing; the journal entry read up to.
  std::atomic<int> mode_{0};
  std::atomic<uint64_t> journal_entry_{0};

  Mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ GUARDED_BY(stop_mu_) = false;
  // Last: joined (Stop) before anything it uses goes.
  std::thread thread_;
};

}  // namespace ckptfs
