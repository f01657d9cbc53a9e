// Staging: staged files, the write path of FUSE passthrough, and their seals.
//
// A file created or truncated by open(2) while nobody else has it open gets a staging file under
// <cache_dir>/passthrough/, and the kernel reads and writes that file itself (the daemon sees
// open, flush, fsync and release, no data). Its lifecycle:
//
//   open (O_CREAT/O_TRUNC) -> kernel writes -> close: StageCommit records the staging file as the
//   file's newest bytes (LMDB, one transaction, no copy) -> last writer's release: a seal is
//   queued -> Seal cuts the bytes into chunks (verified names, dedup), commits the manifest in
//   place of the staged record, and removes the staging file once no handle reads it.
//
// Invariants kept: a close is safe against a daemon crash (the record is committed; the bytes are
// in the local filesystem, which a daemon crash does not touch) and the file is never seen torn
// (before its close the previous version stands; a restart drops staging files no record names).
// fsync syncs the staging file before its record and the metadata after it, so the file
// survives a machine crash too. A record written without fsync remembers the boot it was
// written in: after a machine crash its bytes may not have reached the disk, so a restart in
// another boot drops it and the file keeps its previous version (a file that had none is
// removed), as an unsynced close may be undone by a power loss.
//
// The kernel allows passthrough only while no handle of the inode uses the page cache, and
// wants every open of an inode in passthrough mode to name the same staging file: OpenStaged
// decides under the file's lock, counting the handles served through the daemon.
//
// A process the daemon does not see may still write a staging file after the last release: a
// shared mapping kept after its descriptor's close (FUSE passthrough hands mmap to the staging
// file itself, and the kernel sends the release at the close). Before a seal takes a live staging
// file that no handle holds, or the last release drops one, the daemon asks the kernel whether
// anyone has it open for writing (WrittenUnseen, a read lease); if so the file stays staged and its
// seal is tried again until the writer is gone (HoldForUnseen, UnseenLoop). The kernel may drop
// a closed handle's own reference a moment after its release reaches the daemon, so a writer
// counts as one only once kUnseenConfirm tries kUnseenQuick apart saw it; from then on the seal
// is tried every kUnseenRetry and the file's record is kept durable (msync reaches the staging
// file without the daemon).
//
// The state of one staged file lives in its OpenFile (store/open_file.h: Stage, writing_fd,
// released, seal_mu), so an entry of the open-file table is pinned while a seal runs. A seal
// commits its manifest, and recovery and the last release remove files, through the Namespace
// below (store/namespace.h); what only the store above can do (check the local tier's room,
// queue retention) it asks through `Hooks`.
//
// Thread-safe. Which lock guards what:
//   OpenFile::seal_mu  one seal of a file at a time: held for the whole of Seal (reading and
//                  cutting the staging file, syncing its chunks, the commit).
//   OpenFile::mu   f.stage and everything in it, f.cached_opens, f.unborn and f.manifest.
//                  OpenStaged, StageCommit, WaitFailedRelease, TrackWriters, LoadStage and
//                  DropStage REQUIRE it held (by the caller, written on each); ReleaseStaged,
//                  ChangeStaged, Seal, EnsureSealed and SealAll take it (REQUIRES: not held).
//                  f.released is its condition: a writer's release notifies it; Seal and
//                  WaitFailedRelease wait on it, at most kReleaseWait.
//   OpenFile::qmu  f.writing_fd (TrackWriters), f.committed_size and f.committed_data (Seal),
//                  taken under mu: read by GetAttr without mu.
//   ns_->mu()      the namespace lock (Namespace's): taken by StageCommit and Seal around their
//                  write transactions (Namespace::CommitManifestTxn runs under it);
//                  RecoverStaged runs inside the caller's transaction with it held.
//   stage_epoch_   atomic (Stage::epoch values), bumped under the file's mu.
//   seals_stopped_ atomic: set by StopSeals; ScheduleSeal and queued seals test it first.
//   seal_pool_     made by the constructor, reset (joined) only by StopSeals, which Store::Close
//                  calls once no request can come any more; its queue has its own lock, a leaf.
//   boot_id_       const. resume_seals_: Store::Open only (RecoverStaged, then ResumeSeals).
//   unseen_mu_     unseen_ (the inodes held for an unseen writer, each pinned once by the set),
//                  unseen_tries_, unseen_stop_ and the start of unseen_thread_; taken under a file's mu
//                  (HoldForUnseen), takes nothing (a leaf). unseen_thread_ is joined by StopSeals.
// Lock order: seal_mu -> mu -> qmu, and mu -> the namespace lock -> the LMDB writer -> the
// Publisher's unpublished_mu_ (CommitManifestTxn), as in store/store.h. Under mu (without the
// namespace lock) a
// staged-file call also takes the open-file table's lock (MarkStale; Pin in ScheduleSeal), the
// seal pool's (ScheduleSeal) and ChunkCache's (SyncChunks); Hooks::check_room takes none. After a
// seal's mu is released: LocalChunks' holds_mu_ (ReleaseHolds, Reclaim), the tiers' (Kick) and
// Hooks::note_committed (the retention passes' queue lock). Namespace::ReapIfOrphan is called
// with no lock held (it takes the namespace lock). Held across waits: a file's seal_mu and mu across its own
// staging file's fdatasync and chunk syncs, and seal_mu across a wait for a writer's release.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/config.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/file_writer.h"
#include "store/local_chunks.h"
#include "store/manifest.h"
#include "store/memory_budget.h"
#include "store/meta_store.h"
#include "store/namespace.h"
#include "store/open_file.h"
#include "store/open_table.h"
#include "store/publisher.h"

namespace ckptfs {

class Staging {
 public:
  // What staging asks of the store above it.
  struct Hooks {
    // Whether the local tier has room for the daemon's own writes now
    // (FileSessions::CheckRoom(0)); kNoSpace when not. Called under a file's mu; takes no lock.
    std::function<Status()> check_room;
    // A seal committed ino's new version (the retention passes, Store's RetentionPass). Called
    // with no lock held.
    std::function<void(uint64_t ino)> note_committed;
  };

  // cfg, meta, files, chunks, cache, publisher, metrics, ns, reorder_budget, cut_pool
  // (optional) and scanners outlive this. boot_id: this boot's (CurrentBootId). The seal pool
  // gets cfg.write_threads threads.
  Staging(const Config& cfg, MetaStore* meta, OpenTable* files, LocalChunks* chunks,
          ChunkCache* cache, Publisher* publisher, Metrics* metrics, Logger log, Namespace* ns,
          MemoryBudget* reorder_budget, ThreadPool* cut_pool,
          const PayloadScannerFactory& scanners, std::string boot_id, Hooks hooks);
  // Joins the seal pool (StopSeals normally did).
  ~Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // REQUIRES: f.mu held. Serves handle fh from f's staging file when the kernel allows it (no
  // handle uses the page cache); kYes when it does, kSealFirst when the staged bytes must be
  // sealed before a writer opens the file through the daemon.
  enum class StagedOpen { kNo, kYes, kSealFirst };
  Result<StagedOpen> OpenStaged(uint64_t ino, OpenFile& f, bool write, bool truncate,
                                uint64_t fh, int* passthrough_fd);
  // REQUIRES: f.mu held, f.stage set. Records f's staging file as the file's newest bytes
  // (close; fsync with `durable`: its bytes are synced first and the record after).
  Status StageCommit(uint64_t ino, OpenFile& f, bool durable);
  // Release of a handle served by passthrough; false when fh is not one. REQUIRES: f.mu not
  // held.
  Result<bool> ReleaseStaged(uint64_t ino, OpenFile& f, uint64_t fh);
  // REQUIRES: lock holds f.mu. Before a reader is served from f's staging file: when a commit of
  // its bytes failed (Stage::failed) and writers still hold it, waits for their releases (up to
  // kReleaseWait), which drop those bytes, so that the reader gets the committed version; kIo
  // if they are still held then.
  Status WaitFailedRelease(uint64_t ino, OpenFile& f, std::unique_lock<std::mutex>& lock);
  // When ino's staging file is in use by the kernel (passthrough handles open), applies fn to it
  // (fn returns 0 or an errno) and returns true; `bytes`: fn changes its bytes (a new version,
  // committed and sealed like a close when no writer has it open). False, untouched, otherwise.
  // REQUIRES: ino's mu not held.
  Result<bool> ChangeStaged(uint64_t ino, const std::function<int(int fd)>& fn, bool bytes);
  // Seals whatever is staged for ino and not open for writing now, so that its manifest is
  // current (until then the inode record and manifest describe the previous version; GetAttr
  // shows the staged size). Ok at once when nothing is staged. REQUIRES: no lock of ino held,
  // the namespace lock not held.
  Status EnsureSealed(uint64_t ino);
  // EnsureSealed of every staged file that no writer has open now.
  Status SealAll();

  // At open (REQUIRES: inside txn, the namespace lock held; a comment: clang cannot tell the
  // caller's Namespace is ns_): drops staged records whose bytes did not survive (see
  // StagedRecord) and remembers the inodes whose staged bytes are to be sealed, which
  // ResumeSeals queues. `clean`: the last stop was clean (it synced every staging file).
  Status RecoverStaged(MetaStore::Txn& txn, bool clean, std::vector<ChunkId>* freed);
  // Recovery's rule for a staged record: its staging file is there whole, and its bytes reached
  // the disk (fsync, this boot, or a clean stop since). Fallbacks::Recover asks it too.
  bool StagedSurvives(const StagedRecord& r, bool clean) const;
  // Queues the seals RecoverStaged found, once the store is open.
  void ResumeSeals();
  // Seals not begun stay staged (resumed at the next mount); a running one finishes first
  // (Store::Close). Afterwards nothing is sealed in the background. Files held for an unseen
  // writer stay staged too.
  void StopSeals();

 private:
  // REQUIRES: f.mu held. Sets or clears f.writing_fd as f's stage has writers or not.
  static void TrackWriters(OpenFile& f);
  // REQUIRES: f.mu held. Opens the staging file of ino's staged record into f.stage, unless
  // f.stage is set or nothing is staged.
  Status LoadStage(uint64_t ino, OpenFile& f);
  // REQUIRES: f.mu held, f.stage set, no handle of it. Closes and removes the staging file.
  void DropStage(uint64_t ino, OpenFile& f);
  // Queues a seal of ino (pinning the file until it ran).
  void ScheduleSeal(uint64_t ino);
  // Cuts the staged bytes of ino into chunks and commits them. REQUIRES: f pinned, f.seal_mu and
  // f.mu not held.
  // wait_release: when every writer of the live staging file has closed it and only their
  // releases are outstanding, wait for them (up to kReleaseWait) and seal, so that a reader
  // after a close sees that close's bytes. Without it such a file is left to its release.
  Status Seal(uint64_t ino, OpenFile& f, bool wait_release = false);
  // REQUIRES: f.mu held, f.stage set with no handle and no writer. Whether a process the daemon
  // does not see has f's staging file open for writing (see the top). Reopens the daemon's own
  // descriptor of it, which would otherwise count.
  bool WrittenUnseen(uint64_t ino, OpenFile& f);
  // REQUIRES: f.mu held, f pinned (a seal's), WrittenUnseen(ino, f). Records f's staging file
  // durably as the file's bytes and has its seal tried again later (pinning ino until then).
  Status HoldForUnseen(uint64_t ino, OpenFile& f);
  // unseen_thread_: every kUnseenRetry, seals the files held for an unseen writer.
  void UnseenLoop();
  // Whether r's staging file is there whole.
  bool StagingFilePresent(const StagedRecord& r) const;

  const Config& cfg_;
  MetaStore* const meta_;
  OpenTable* const files_;
  LocalChunks* const chunks_;
  ChunkCache* const cache_;
  Publisher* const publisher_;
  Metrics* const metrics_;
  const Logger log_;
  Namespace* const ns_;  // its lock and the commit's metadata (below staging)
  // What seals give their FileWriters: the reorder windows' memory, the cut threads (may be
  // null) and the format scanners, the store's, shared with its sessions.
  MemoryBudget* const reorder_budget_;
  ThreadPool* const cut_pool_;
  const PayloadScannerFactory& scanners_;
  const std::string boot_id_;
  const Hooks hooks_;

  std::atomic<uint64_t> stage_epoch_{0};  // Stage::epoch values, unique across stages
  std::atomic<bool> seals_stopped_{false};
  std::vector<uint64_t> resume_seals_;  // staged at the last stop; sealed once open
  Mutex unseen_mu_;
  std::condition_variable unseen_cv_;
  std::unordered_set<uint64_t> unseen_ GUARDED_BY(unseen_mu_);
  // Seals held in a row, per inode (cleared by a seal that was not held).
  std::unordered_map<uint64_t, int> unseen_tries_ GUARDED_BY(unseen_mu_);
  bool unseen_stop_ GUARDED_BY(unseen_mu_) = false;
  std::thread unseen_thread_;  // started by the first HoldForUnseen, joined by StopSeals
  // Last: joined (StopSeals, or here) before anything its seals use goes.
  std::unique_ptr<ThreadPool> seal_pool_;
};

}  // namespace ckptfs
