// Store: prefetch hints and pins. Prefetch pulls the chunks of a file or a tree onto the local
// disk tier ahead of the reads (user.ckptfs.prefetch, `ckptfs prefetch`, the warming of a
// checkpoint when one of its files is opened); pins keep chunks there whatever cache_size says
// (user.ckptfs.pin); Cached reports how much of a file or tree is local (user.ckptfs.cached).
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <set>
#include <unordered_set>

#include "store/remote_tier.h"
#include "store/store.h"
#include "store/tree_walk.h"

namespace ckptfs {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPinPassInterval = std::chrono::seconds(10);
constexpr size_t kMaxWarmedDirs = 1024;

}  // namespace

// The prefetch queue and the pins. Jobs run in the order they came; each is first expanded (its
// files' chunks not on disk, listed once from one LMDB snapshot) and then fetched, one chunk per
// thread at a time, through ChunkCache::Warm, in file order except where a reader of a cold file
// shows where it is going (ReaderWants). The chunks readers want come before any job's. A worker
// with nothing to do applies the pins again every kPinPassInterval while any exist.
//
// Lock order: pin_mu_ -> mu_ (ApplyPins queues jobs). Neither is held during I/O or LMDB walks,
// except pin_mu_, which serializes the pin passes (walks of the pinned trees).
class Store::Prefetcher {
 public:
  Prefetcher(Store* store, unsigned threads) : store_(store) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~Prefetcher() { Stop(); }

  void Stop() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      jobs_.clear();  // a worker in a fetch holds its job; it finishes that chunk only
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
  }

  // Queues a job; false when one for (root, recursive) is pending already, or after Stop.
  bool Add(uint64_t root, bool recursive) {
    std::lock_guard lock(mu_);
    if (stop_) return false;
    for (const auto& j : jobs_) {
      if (j->root == root && j->recursive == recursive && !j->cancelled) return false;
    }
    auto job = std::make_shared<Job>();
    job->root = root;
    job->recursive = recursive;
    job->start = Clock::now();
    jobs_.push_back(std::move(job));
    cv_.notify_all();
    return true;
  }

  void Cancel(uint64_t root) {
    std::lock_guard lock(mu_);
    for (const auto& j : jobs_) {
      if (j->root == root) j->cancelled = true;
    }
    ReapLocked();
  }

  // Chunks a reader of a cold file reaches next (Store::FetchSoon). A job that holds the first
  // of them moves its cursor there, to go on with what that reader reads next; and they are
  // fetched before any job's chunks, into the RAM tier (the reader takes them from there, or
  // joins the fetch when it gets there first). The oldest of these wishes are dropped past
  // kMaxUrgent, as their reader has moved on.
  void ReaderWants(const std::vector<std::pair<ChunkId, uint64_t>>& chunks) {
    std::lock_guard lock(mu_);
    if (stop_ || chunks.empty()) return;
    for (const auto& j : jobs_) {
      if (j->cancelled || j->state != Job::State::kReady || j->Exhausted()) continue;
      auto it = j->index.find(chunks.front().first);
      if (it != j->index.end()) j->cursor = it->second;
    }
    // Asked for in any case: the job may be behind another, or its chunk shared with another
    // file. A chunk both fetch is fetched once (ChunkCache's single flight; the later one finds
    // it on disk).
    for (const auto& c : chunks) urgent_.push_back(c);
    while (urgent_.size() > kMaxUrgent) urgent_.pop_front();
    cv_.notify_all();
  }

  bool Pending(uint64_t root) {
    std::lock_guard lock(mu_);
    return std::any_of(jobs_.begin(), jobs_.end(),
                       [&](const auto& j) { return j->root == root && !j->cancelled; });
  }

  // The predictive throttle: true at most once per directory per kWarmIntervalS.
  bool ShouldWarm(uint64_t dir) {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    const auto interval = std::chrono::seconds(kWarmIntervalS);
    if (warmed_.size() >= kMaxWarmedDirs) {
      std::erase_if(warmed_, [&](const auto& w) { return now - w.second >= interval; });
      if (warmed_.size() >= kMaxWarmedDirs) warmed_.clear();  // bounded, at worst a warm early
    }
    auto [it, fresh] = warmed_.emplace(dir, now);
    if (!fresh && now - it->second < interval) return false;
    it->second = now;
    return true;
  }

  // Recomputes the chunks the pinned inodes hold, hands them to the cache, and (fetch) queues a
  // prefetch of each pinned inode that has chunks off the disk tier.
  Status ApplyPins(bool fetch);
  // Pins `ino` or not in the in-memory set (the attribute is the caller's business).
  void NotePin(uint64_t ino, bool pin) {
    std::lock_guard lock(pin_mu_);
    if (pin) {
      pinned_.insert(ino);
    } else {
      pinned_.erase(ino);
    }
  }
  Status LoadPins();

 private:
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
    int running = 0;                                   // chunks being fetched now
    uint64_t fetched = 0, fetched_bytes = 0, failed = 0;
    Status last_error;
    Clock::time_point start;
  };

  void Loop();
  // The chunks of job's files that are not on the disk tier, each once.
  Result<std::vector<std::pair<ChunkId, uint64_t>>> Expand(const Job& job);
  Status FetchOne(const ChunkId& id, uint64_t len);
  // Drops finished and cancelled jobs that no worker is busy with. REQUIRES: mu_ held.
  void ReapLocked();

  Store* const store_;
  std::mutex mu_;
  std::condition_variable cv_;              // work queued, or Stop
  std::deque<std::shared_ptr<Job>> jobs_;   // guarded by mu_
  static constexpr size_t kMaxUrgent = 64;
  std::deque<std::pair<ChunkId, uint64_t>> urgent_;  // guarded by mu_
  bool stop_ = false;                       // guarded by mu_
  Clock::time_point next_pin_pass_ = Clock::now() + kPinPassInterval;  // guarded by mu_
  std::unordered_map<uint64_t, Clock::time_point> warmed_;            // guarded by mu_
  std::mutex pin_mu_;
  std::set<uint64_t> pinned_;  // guarded by pin_mu_: inodes with kPinXattr
  std::atomic<bool> has_pins_{false};
  std::vector<std::thread> threads_;  // guarded by mu_ (moved out by Stop)
};

void Store::Prefetcher::ReapLocked() {
  std::erase_if(jobs_, [&](const std::shared_ptr<Job>& j) {
    if (j->running > 0 || j->state == Job::State::kExpanding) return false;
    const bool done = j->state == Job::State::kReady && j->Exhausted();
    if (!done && !j->cancelled) return false;
    const double secs = std::chrono::duration<double>(Clock::now() - j->start).count();
    if (j->failed) {
      store_->log_->warn("prefetch of inode {}: {} chunks could not be fetched ({})", j->root,
                         j->failed, j->last_error.ToString());
    }
    if (j->fetched) {
      store_->log_->info("prefetch of inode {}{}: {} chunks, {} MiB in {:.1f} s", j->root,
                         j->cancelled ? " (cancelled)" : "", j->fetched, j->fetched_bytes >> 20,
                         secs);
    }
    return true;
  });
}

void Store::Prefetcher::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (!urgent_.empty()) {
      const auto [id, len] = urgent_.front();
      urgent_.pop_front();
      lock.unlock();
      (void)store_->cache_->Get(id, len);  // a failure is the reader's to see, on its own Get
      lock.lock();
      continue;
    }
    std::shared_ptr<Job> job;
    std::pair<ChunkId, uint64_t> chunk;
    bool expand = false;
    for (const auto& j : jobs_) {
      if (j->cancelled) continue;
      if (j->state == Job::State::kNew) {
        j->state = Job::State::kExpanding;
        job = j;
        expand = true;
        break;
      }
      if (j->state == Job::State::kReady && !j->Exhausted()) {
        chunk = j->Claim();
        ++j->running;
        job = j;
        break;
      }
    }
    if (!job) {
      if (Clock::now() < next_pin_pass_) {
        cv_.wait_until(lock, next_pin_pass_);
        continue;
      }
      next_pin_pass_ = Clock::now() + kPinPassInterval;
      if (!has_pins_) continue;
      lock.unlock();
      if (Status st = ApplyPins(true); !st.ok()) {
        store_->log_->warn("applying pins: {}", st.ToString());
      }
      lock.lock();
      continue;
    }
    lock.unlock();
    if (expand) {
      auto chunks = Expand(*job);
      lock.lock();
      if (chunks.ok()) {
        job->chunks = std::move(*chunks);
        job->claimed.assign(job->chunks.size(), false);
        for (size_t i = 0; i < job->chunks.size(); ++i) job->index.emplace(job->chunks[i].first, i);
      } else if (chunks.status().code() != Code::kNotFound) {
        ++job->failed;
        job->last_error = chunks.status();
      }
      job->state = Job::State::kReady;
    } else {
      Status st = FetchOne(chunk.first, chunk.second);
      lock.lock();
      --job->running;
      if (st.ok()) {
        ++job->fetched;
        job->fetched_bytes += chunk.second;
      } else {
        ++job->failed;
        job->last_error = st;
      }
    }
    ReapLocked();
    cv_.notify_all();
  }
}

Result<std::vector<std::pair<ChunkId, uint64_t>>> Store::Prefetcher::Expand(const Job& job) {
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  std::vector<std::pair<ChunkId, uint64_t>> out;
  ASSIGN_OR_RETURN(auto txn, store_->meta_->Begin(false));
  RETURN_IF_ERROR(ForEachFile(txn, job.root, job.recursive, [&](uint64_t, const Manifest& m) {
    for (const Extent& e : m.extents()) {
      if (e.hole() || !seen.insert(e.id).second) continue;
      if (!store_->cache_->OnDisk(e.id)) out.emplace_back(e.id, e.len);
    }
  }));
  return out;
}

Status Store::Prefetcher::FetchOne(const ChunkId& id, uint64_t len) {
  // A file replaced since the job was expanded: its old chunks are not brought back (nothing
  // would reclaim them).
  {
    ASSIGN_OR_RETURN(auto txn, store_->meta_->Begin(false));
    ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(id));
    if (r.refs == 0) return Status::Ok();
  }
  return store_->cache_->Warm(id, len);
}

Status Store::Prefetcher::ApplyPins(bool fetch) {
  std::lock_guard pl(pin_mu_);
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> keep;
  std::vector<uint64_t> incomplete;
  const bool remote = !store_->remotes_.empty();
  {
    ASSIGN_OR_RETURN(auto txn, store_->meta_->Begin(false));
    for (auto it = pinned_.begin(); it != pinned_.end();) {
      bool missing = false;
      Status st = ForEachFile(txn, *it, true, [&](uint64_t, const Manifest& m) {
        for (const Extent& e : m.extents()) {
          if (e.hole() || !keep.emplace(e.id, e.len).second) continue;
          if (remote && !missing && !store_->cache_->OnDisk(e.id)) missing = true;
        }
      });
      if (st.code() == Code::kNotFound) {  // deleted: its attribute went with it
        it = pinned_.erase(it);
        continue;
      }
      RETURN_IF_ERROR(st);
      if (missing) incomplete.push_back(*it);
      ++it;
    }
  }
  has_pins_ = !pinned_.empty();
  store_->cache_->SetPinned(std::move(keep));
  if (fetch) {
    for (uint64_t ino : incomplete) Add(ino, true);
  }
  return Status::Ok();
}

Status Store::Prefetcher::LoadPins() {
  {
    std::lock_guard pl(pin_mu_);
    ASSIGN_OR_RETURN(auto txn, store_->meta_->Begin(false));
    std::unordered_set<uint64_t> seen{kRootIno};
    auto check = [&](uint64_t ino) -> Status {
      auto v = txn.GetXattr(ino, kPinXattr);
      if (v.ok() && *v == "1") pinned_.insert(ino);
      return v.ok() || v.status().code() == Code::kNoData ? Status::Ok() : v.status();
    };
    RETURN_IF_ERROR(check(kRootIno));
    RETURN_IF_ERROR(txn.WalkTree(kRootIno, true, [&](const DirEntry& e) -> Status {
      if (!seen.insert(e.ino).second || !(S_ISDIR(e.mode) || S_ISREG(e.mode))) {
        return Status::Ok();
      }
      return check(e.ino);
    }));
    if (!pinned_.empty()) store_->log_->info("{} pinned files and directories", pinned_.size());
  }
  return ApplyPins(true);
}

Store::Prefetcher& Store::prefetcher() {
  std::call_once(prefetch_once_, [this] {
    // Without a backend nothing is ever fetched or evicted: no threads.
    const unsigned threads = !remotes_.empty() ? std::clamp<unsigned>(cfg_.upload_threads, 1, 8) : 0;
    prefetch_ = std::make_shared<Prefetcher>(this, threads);
  });
  return *prefetch_;
}

Status Store::Prefetch(uint64_t ino, bool recursive) {
  ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
  (void)rec;
  if (remotes_.empty()) return Status::Ok();
  prefetcher().Add(ino, recursive);
  return Status::Ok();
}

void Store::FetchSoon(const std::vector<std::pair<ChunkId, uint64_t>>& chunks) {
  if (!remotes_.empty()) prefetcher().ReaderWants(chunks);
}

void Store::CancelPrefetch(uint64_t ino) { prefetcher().Cancel(ino); }

bool Store::Prefetching(uint64_t ino) { return prefetcher().Pending(ino); }

void Store::StopPrefetch() { prefetcher().Stop(); }

Result<Store::CacheUsage> Store::Cached(uint64_t ino) {
  RETURN_IF_ERROR(SealAll());  // what staged files hold is counted once it is in chunks
  CacheUsage u;
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  RETURN_IF_ERROR(ForEachFile(txn, ino, true, [&](uint64_t, const Manifest& m) {
    ++u.files;
    for (const Extent& e : m.extents()) {
      if (e.hole() || !seen.insert(e.id).second) continue;
      ++u.chunks;
      u.bytes += e.len;
      if (cache_->OnDisk(e.id)) {
        ++u.cached_chunks;
        u.cached_bytes += e.len;
      }
    }
  }));
  return u;
}

Status Store::SetPin(uint64_t ino, bool pin) {
  ASSIGN_OR_RETURN(InodeRecord rec, GetAttr(ino));
  if (!S_ISREG(rec.mode) && !S_ISDIR(rec.mode)) {
    return Invalid("only files and directories can be pinned");
  }
  if (pin) {
    RETURN_IF_ERROR(SetXattr(ino, kPinXattr, "1", 0));
  } else {
    RETURN_IF_ERROR(RemoveXattr(ino, kPinXattr));
  }
  Prefetcher& p = prefetcher();
  p.NotePin(ino, pin);
  return p.ApplyPins(pin);
}

Status Store::LoadPins() { return prefetcher().LoadPins(); }

Status Store::WarmCheckpoint(uint64_t ino, uint64_t dir, bool recursive) {
  if (remotes_.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(auto m, CommittedManifest(ino));
  const auto& extents = m->extents();
  const bool all_local = std::all_of(extents.begin(), extents.end(), [&](const Extent& e) {
    return e.hole() || cache_->OnDisk(e.id);
  });
  if (all_local || !prefetcher().ShouldWarm(dir)) return Status::Ok();
  log_->debug("inode {} opened with chunks off the local tier: warming directory {}", ino, dir);
  return Prefetch(dir, recursive);
}

Result<std::pair<uint64_t, std::string>> Store::ParentOf(uint64_t ino) {
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  return txn.GetParent(ino);
}

}  // namespace ckptfs
