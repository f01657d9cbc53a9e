// RemoteTier: writes a store back to a remote backend (backends/backend.h), behind the writers.
//
// The bucket (under the backend's prefix) holds:
//   chunks/<2 hex>/<32 hex>   chunk bytes, named by content: written once by whichever node has
//                             the chunk first, never rewritten, shared by every file and node
//   files/<path>              a committed file: its attributes and manifest (FileRecord)
//   dirs/<path>               an empty marker for a directory made with mkdir
//   journal/<20-digit seq>    one per change of files/ or dirs/, written after it (the farthest
//                             tier only; store/journal.h, docs/journal.md)
//
// Every namespace change that the backend must see is queued in LMDB (MetaStore remote_ops) in
// the same transaction as the change itself, so a crash or a restart loses none: the queue is
// worked off in order, from where it stopped. A file is published chunks first, then its record
// (invariant 2 for the remote side: another node never sees a record whose chunks are missing).
// A chunk the backend already holds (HEAD) is not uploaded again: dedup is global across nodes.
//
// A file that moves (rename(2) of it or of a directory above it) is unpublished under its old
// path and published again under the new one: the move queues the deletion of the old record,
// then a publish that carries the file's new path epoch (InodeRecord::path_epoch). A publish op
// of an earlier epoch is stale and skipped: run after the move, it would put the record under
// the path the file has now (A again after A -> B -> A) ahead of the deletion queued for that
// path. A publish the file moves during puts its record, but only a publish whose epoch is still
// the file's once its record is up marks the version as held by the tier (the published table,
// which user.ckptfs.state reads): the deletions queued by the move may undo that record, and the
// publish queued after them puts it back. So whatever the interleaving, the last op queued for a
// file puts its record where it is now, and a tier is said to hold a version only once that
// record is there.
//
// Thread-safe. One worker thread runs the queue in order; the chunks of one file upload in
// parallel on `threads` threads. A failing backend is retried with backoff, forever: nothing
// committed locally is dropped because the backend is down.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "cache/chunk_cache.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/journal.h"
#include "store/manifest.h"
#include "store/meta_store.h"

namespace ckptfs {

// What files/<path> holds.
struct FileRecord {
  uint32_t mode = 0;  // type and permission bits
  uint32_t uid = 0, gid = 0;
  int64_t mtime_ns = 0;
  uint64_t generation = 0;  // of the inode on the node that published it
  std::string origin;       // that node's id (the cache directory's random id)
  Manifest manifest;

  // Encode ends the record with the XXH3-128 of its other bytes; Decode checks it (kCorrupt), so
  // a record damaged in the backend or on the way is never applied.
  std::string Encode() const;
  static Result<FileRecord> Decode(std::string_view bytes);
};

// The ops of the remote_ops queue.
namespace remote_op {
// Put files/<path of ino> (and its chunks), unless ino moved since: path_epoch is ino's
// InodeRecord::path_epoch as the op is queued.
std::string PublishFile(uint64_t ino, uint64_t path_epoch);
std::string Unpublish(std::string_view path);   // delete files/<path>
std::string PublishDir(std::string_view path);  // put dirs/<path>
std::string UnpublishDir(std::string_view path);
}  // namespace remote_op

class RemoteTier {
 public:
  // How the errors of a publish that waits for a gc round begin (kBusy; retried soon, no
  // backoff). Other kBusy errors (an S3 409) back off like any failure.
  static constexpr std::string_view kGcWait = "waiting for gc round ";
  static bool IsGcWait(const Status& st) {
    return st.code() == Code::kBusy && st.message().rfind(kGcWait, 0) == 0;
  }

  // backend, meta, cache and metrics outlive the tier. `origin` names this node in FileRecords.
  // `tier`: its place in the chain, nearest first (0..kMaxTiers-1): it works off that tier's
  // queue and keeps that tier's marks.
  RemoteTier(Backend* backend, MetaStore* meta, ChunkCache* cache, Metrics* metrics,
             std::string origin, uint32_t threads, int tier);
  // Stops the worker (see Stop).
  ~RemoteTier();

  // The garbage-collection protocol (store/gc.h, docs/gc.md): the longest this node lets pass
  // from reading gc/round to the end of a record's PUT that relied on chunks the backend held.
  // A collector's grace must be longer. Call before Start.
  void SetGcWindow(double seconds) { gc_window_s_ = seconds; }
  // Called on the worker after a publish op for `ino` is done (published, or the file is gone).
  // Call before Start.
  void SetPublishedListener(std::function<void(uint64_t ino)> fn) { on_published_ = std::move(fn); }
  // Run on the worker when the queue is empty after new work (and once at the start): the
  // tier's keep= policy. An error is logged and the call repeated at the next idle moment.
  // Call before Start.
  void SetIdleWork(std::function<Status()> fn) { idle_work_ = std::move(fn); }
  // The farthest tier (the namespace): every change of files/ and dirs/ is announced in the
  // journal once it is in the bucket. Call before Start.
  void SetJournal(NamespaceJournal* journal) { journal_ = journal; }

  // Starts the worker on the queue as it is in LMDB.
  void Start();
  // Finishes the op in flight and stops; the rest stay queued for the next start.
  void Stop();
  // Ops were queued: wakes the worker.
  void Kick();

  // Waits until the backend holds generation `generation` of file `ino` (or a later one), or the
  // file is gone. kIo with the last backend error after `timeout_s` seconds.
  Status WaitPublished(uint64_t ino, uint64_t generation, double timeout_s);
  // Waits until every op queued so far is done (tests, umount with durability=remote).
  Status Drain(double timeout_s);

  Backend* backend() const { return backend_; }
  int tier() const { return tier_; }
  // The last error of the queue's work, and whether the worker is waiting to retry it.
  Status last_error() const;

  // Moves whenever this node takes a gc round into account (a round begins or ends here). Marks
  // ("the backend holds this chunk") drawn from records read under an older value may name
  // chunks the round deleted: the namespace sync sets none then.
  uint64_t gc_generation() const { return gc_generation_.load(); }

 private:
  // Calls fn, one backend request, up to four times while it fails with kIo (100 ms, 200 ms and
  // 300 ms apart; each failure logged): one failure among the many requests of a publish or a
  // revalidation would otherwise start them all again, and a publish's chunks, put but not yet
  // named by its record, are what the next gc round condemns.
  void NoteRetry(const Status& st);  // logs a failure Tried tries again
  static const Status& StatusOf(const Status& st) { return st; }
  template <class T>
  static const Status& StatusOf(const Result<T>& r) { return r.status(); }
  template <class Fn>
  auto Tried(Fn fn) -> decltype(fn()) {
    auto r = fn();
    for (int attempt = 1; attempt < 4 && StatusOf(r).code() == Code::kIo; ++attempt) {
      NoteRetry(StatusOf(r));
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
      r = fn();
    }
    return r;
  }
  void Loop();
  Status Process(std::string_view op);
  // path_epoch: the op's (none: an op of store format 2, which never marks the tier as holding
  // the file; see Publisher::QueueUnpublished).
  Status PublishFile(uint64_t ino, std::optional<uint64_t> path_epoch);
  // Appends "key changed" to the journal (the farthest tier only), once the change is made.
  Status Announce(const std::string& key) {
    return journal_ ? journal_->Append(key) : Status::Ok();
  }
  // Puts the chunks of m the backend lacks; *held gets every chunk it holds, to be marked
  // evictable once the file's record is up.
  Status UploadChunks(const Manifest& m, std::vector<std::pair<ChunkId, uint64_t>>* held);

  // gc (worker thread only). Reads gc/round unless read within half the window (or `force`),
  // and follows it: a round seen active has its condemned chunks unmarked (and fetched back
  // when a local file names them); a round missed, or ended while this node looked away, has
  // every mark checked against the backend.
  Status RefreshGc(bool force);
  Status EndGcRound();
  Status UnmarkCondemned(bool fetch_back);
  Status RevalidateMarks();
  // kBusy when the file names a chunk the active round condemned: it waits for the round.
  Status CheckGc(const Manifest& m) const;

  Backend* const backend_;
  MetaStore* const meta_;
  ChunkCache* const cache_;
  Metrics* const metrics_;
  const std::string origin_;
  const int tier_;
  Logger log_;
  std::unique_ptr<ThreadPool> upload_pool_;

  // A leaf: held for flags and counters only, never across a backend call or a transaction.
  mutable Mutex mu_;
  std::condition_variable work_cv_;  // the worker waits here for ops
  std::condition_variable done_cv_;  // waiters: an op finished
  bool kicked_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t done_upto_ GUARDED_BY(mu_) = 0;       // the last op seq finished
  uint64_t queue_empty_at_ GUARDED_BY(mu_) = 0;  // done_upto_ when the queue was last empty
  Status last_error_ GUARDED_BY(mu_);
  std::thread worker_;  // started and joined by Start/Stop (one controlling thread)

  double gc_window_s_ = 300;
  std::function<void(uint64_t ino)> on_published_;
  std::function<Status()> idle_work_;
  NamespaceJournal* journal_ = nullptr;
  std::atomic<uint64_t> gc_generation_{0};
  struct GcView {
    bool read = false;                          // gc/round was read at least once
    std::chrono::steady_clock::time_point read_at;  // when that GET was sent
    uint64_t epoch = 0;                         // of the last round seen
    bool active = false;                        // following an active round
    std::chrono::steady_clock::time_point active_since;
    double deadline_s = 0;
    std::vector<ChunkId> condemned;             // sorted; while active
    bool fetch_pending = false;                 // a fetch-back failed: try again
    uint64_t expired = 0;                       // a round given up on (its collector vanished)
  } gc_;
};

}  // namespace ckptfs
