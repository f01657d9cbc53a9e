// Prefetcher: the prefetch queue and the pins. Prefetch pulls the chunks of a file or a tree onto
// the local disk tier ahead of the reads (user.ckptfs.prefetch, `ckptfs prefetch`, the warming of
// a checkpoint when one of its files is opened); pins keep chunks there whatever cache_size says
// (user.ckptfs.pin). CountCached reports how much of a file or tree is local
// (user.ckptfs.cached).
//
// Jobs run in the order they came; each is first expanded (its files' chunks not on disk, listed
// once from one LMDB snapshot) and then fetched, one chunk per thread at a time, through
// ChunkCache::Warm, in file order except where a reader of a cold file shows where it is going
// (ReaderWants). The chunks readers want come before any job's. A worker with nothing to do
// applies the pins again every kPinPassInterval while any exist. Chunks come from the remote
// tiers' backends through ChunkCache (ChunkCache::AttachRemote), so the prefetcher needs to know
// only whether there are any: without them every chunk is local and nothing is fetched or
// evicted.
//
// Thread-safe. Which lock guards what:
//   mu_       jobs_ (and the fields of each Job), urgent_, stop_, next_pin_pass_, warmed_,
//             threads_ (moved out by Stop); cv_ waits on it.
//   pin_mu_   pinned_; held across a pin pass (a walk of the pinned trees in one LMDB read
//             transaction) so that passes run one at a time.
//   has_pins_ atomic.
// Lock order: pin_mu_ -> mu_ (ApplyPins queues jobs). Both come after every store lock: the store
// calls in under a file's mu (Read -> ReadAhead -> FetchSoon -> ReaderWants), and nothing here
// takes a store lock. Neither is held during a fetch or an LMDB walk, except pin_mu_ as said;
// ChunkCache is called with mu_ released, and takes only its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/status.h"
#include "store/meta_store.h"

namespace ckptfs {

// How much of a file or a tree is on the local disk tier (Store::Cached).
struct CacheUsage {
  uint64_t files = 0;                            // regular files counted (hard links once)
  uint64_t chunks = 0, bytes = 0;                // their distinct chunks (holes excluded)
  uint64_t cached_chunks = 0, cached_bytes = 0;  // of those, on the local disk tier
};

// Of file `ino`, or of every file under directory `ino`, as committed (one LMDB snapshot, an
// in-memory lookup per chunk). Takes no lock but the cache's.
Result<CacheUsage> CountCached(MetaStore& meta, const ChunkCache& cache, uint64_t ino);

class Prefetcher {
 public:
  // The attribute that pins a file or directory ("1"; Store::kPinXattr).
  static constexpr std::string_view kPinXattr = "user.ckptfs.pin";
  // ShouldWarm's interval (Store::kWarmIntervalS).
  static constexpr int kWarmIntervalS = 60;

  // meta, cache and log outlive this. `remote`: the store has remote tiers (a pinned tree with
  // chunks off the disk tier is then fetched). `threads`: the workers (0: none, nothing queued
  // is ever run).
  Prefetcher(MetaStore* meta, ChunkCache* cache, Logger log, bool remote, unsigned threads);
  // Stops the workers.
  ~Prefetcher() { Stop(); }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Drops the jobs queued and joins the workers; a worker in a fetch finishes that chunk only.
  // Idempotent; Add afterwards queues nothing.
  void Stop() EXCLUDES(mu_);

  // Queues a job (the chunks of file `root`, or of every file under directory `root`, all
  // levels when `recursive`, pulled onto the disk tier; a chunk being fetched holds one buffer,
  // nothing is kept in the RAM tier). Returns at once: false when one for (root, recursive) is
  // pending already, or after Stop.
  bool Add(uint64_t root, bool recursive) EXCLUDES(mu_);
  // Drops the jobs for `root` itself; the chunks being fetched now finish.
  void Cancel(uint64_t root) EXCLUDES(mu_);
  // Chunks a reader of a cold file reaches next (FileSessions::Hooks::fetch_soon). A job that
  // holds the first of them moves its cursor there, to go on with what that reader reads next;
  // and they are fetched before any job's chunks, into the RAM tier (the reader takes them from
  // there, or joins the fetch when it gets there first). The oldest of these wishes are dropped past
  // kMaxUrgent, as their reader has moved on.
  void ReaderWants(const std::vector<std::pair<ChunkId, uint64_t>>& chunks) EXCLUDES(mu_);
  // Whether a job for `root` is queued or running.
  bool Pending(uint64_t root) EXCLUDES(mu_);
  // Predictive prefetch: whether to warm `dir`, the checkpoint of a file opened for reading
  // whose manifest is `m`: when not all of m's chunks are on the disk tier, at most once per
  // directory per kWarmIntervalS.
  bool ShouldWarm(uint64_t dir, const Manifest& m) EXCLUDES(mu_);

  // Recomputes the chunks the pinned inodes hold, hands them to the cache, and (fetch) queues a
  // prefetch of each pinned inode that has chunks off the disk tier.
  Status ApplyPins(bool fetch) EXCLUDES(pin_mu_, mu_);
  // Pins `ino` or not in the in-memory set (the attribute is the caller's business).
  void NotePin(uint64_t ino, bool pin) EXCLUDES(pin_mu_);
  // Finds the inodes with kPinXattr (one walk of the namespace), then ApplyPins(true). While
  // pins exist they are applied again every few seconds, so that files written, synced or
  // replaced under a pinned directory are kept and fetched too.
  Status LoadPins() EXCLUDES(pin_mu_, mu_);

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kPinPassInterval = std::chrono::seconds(10);
  static constexpr size_t kMaxWarmedDirs = 1024;
  static constexpr size_t kMaxUrgent = 64;

  // One prefetch request. Its fields are guarded by the Prefetcher's mu_.
  struct Job {
    uint64_t root = 0;
    bool recursive = true;
    bool cancelled = false;
    enum class State { kNew, kExpanding, kReady } state = State::kNew;
    std::vector<std::pair<ChunkId, uint64_t>> chunks;  // to fetch, once kReady
    // Chunks are claimed from `cursor` on, in order, skipping those claimed already. A reader
    // that misses a chunk of the job moves the cursor there (ReaderWants): the job then fetches
    // what that reader reads next, and comes back for what it skipped at the end.
    std::unordered_map<ChunkId, size_t, ChunkIdHash> index;  // chunk -> position in chunks
    std::vector<bool> claimed;
    size_t cursor = 0, claimed_count = 0;
    bool Exhausted() const { return claimed_count >= chunks.size(); }
    std::pair<ChunkId, uint64_t> Claim() {
      if (cursor >= chunks.size()) cursor = 0;
      while (claimed[cursor]) cursor = cursor + 1 < chunks.size() ? cursor + 1 : 0;
      claimed[cursor] = true;
      ++claimed_count;
      return chunks[cursor++];
    }
    int running = 0;  // chunks being fetched now
    uint64_t fetched = 0, fetched_bytes = 0, failed = 0;
    Status last_error;
    Clock::time_point start;
  };

  // A worker's loop, until Stop.
  void Loop() EXCLUDES(mu_);
  // The chunks of job's files that are not on the disk tier, each once.
  Result<std::vector<std::pair<ChunkId, uint64_t>>> Expand(const Job& job);
  Status FetchOne(const ChunkId& id, uint64_t len);
  // Drops finished and cancelled jobs that no worker is busy with.
  void ReapLocked() REQUIRES(mu_);

  MetaStore* const meta_;
  ChunkCache* const cache_;
  const Logger log_;
  const bool remote_;
  Mutex pin_mu_ ACQUIRED_BEFORE(mu_);
  std::set<uint64_t> pinned_ GUARDED_BY(pin_mu_);  // inodes with kPinXattr
  std::atomic<bool> has_pins_{false};
  Mutex mu_;
  std::condition_variable cv_;  // work queued, or Stop
  std::deque<std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);
  std::deque<std::pair<ChunkId, uint64_t>> urgent_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  Clock::time_point next_pin_pass_ GUARDED_BY(mu_) = Clock::now() + kPinPassInterval;
  std::unordered_map<uint64_t, Clock::time_point> warmed_ GUARDED_BY(mu_);
  // Last: started in the constructor once every other field is ready.
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
