// Prefetcher (store/prefetcher.h): the prefetch queue, its workers, and the pins.
#include "store/prefetcher.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "store/tree_walk.h"

namespace ckptfs {

Prefetcher::Prefetcher(MetaStore* meta, ChunkCache* cache, Logger log, bool remote,
                       unsigned threads)
    : meta_(meta), cache_(cache), log_(std::move(log)), remote_(remote) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void Prefetcher::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    jobs_.clear();  // a worker in a fetch holds its job; it finishes that chunk only
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

bool Prefetcher::Add(uint64_t root, bool recursive) {
  MutexLock lock(&mu_);
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

void Prefetcher::Cancel(uint64_t root) {
  MutexLock lock(&mu_);
  for (const auto& j : jobs_) {
    if (j->root == root) j->cancelled = true;
  }
  ReapLocked();
}

void Prefetcher::ReaderWants(const std::vector<std::pair<ChunkId, uint64_t>>& chunks) {
  MutexLock lock(&mu_);
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

bool Prefetcher::Pending(uint64_t root) {
  MutexLock lock(&mu_);
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [&](const auto& j) { return j->root == root && !j->cancelled; });
}

bool Prefetcher::ShouldWarm(uint64_t dir, const Manifest& m) {
  const auto& extents = m.extents();
  if (std::all_of(extents.begin(), extents.end(),
                  [&](const Extent& e) { return e.hole() || cache_->OnDisk(e.id); })) {
    return false;
  }
  MutexLock lock(&mu_);
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

void Prefetcher::NotePin(uint64_t ino, bool pin) {
  MutexLock lock(&pin_mu_);
  if (pin) {
    pinned_.insert(ino);
  } else {
    pinned_.erase(ino);
  }
}

void Prefetcher::ReapLocked() {
  std::erase_if(jobs_, [&](const std::shared_ptr<Job>& j) {
    if (j->running > 0 || j->state == Job::State::kExpanding) return false;
    const bool done = j->state == Job::State::kReady && j->Exhausted();
    if (!done && !j->cancelled) return false;
    const double secs = std::chrono::duration<double>(Clock::now() - j->start).count();
    if (j->failed) {
      log_->warn("prefetch of inode {}: {} chunks could not be fetched ({})", j->root, j->failed,
                 j->last_error.ToString());
    }
    if (j->fetched) {
      log_->info("prefetch of inode {}{}: {} chunks, {} MiB in {:.1f} s", j->root,
                 j->cancelled ? " (cancelled)" : "", j->fetched, j->fetched_bytes >> 20, secs);
    }
    return true;
  });
}

void Prefetcher::Loop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    if (!urgent_.empty()) {
      const auto [id, len] = urgent_.front();
      urgent_.pop_front();
      lock.Unlock();
      (void)cache_->Get(id, len);  // a failure is the reader's to see, on its own Get
      lock.Lock();
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
        cv_.wait_until(lock.native(), next_pin_pass_);
        continue;
      }
      next_pin_pass_ = Clock::now() + kPinPassInterval;
      if (!has_pins_) continue;
      lock.Unlock();
      if (Status st = ApplyPins(true); !st.ok()) {
        log_->warn("applying pins: {}", st.ToString());
      }
      lock.Lock();
      continue;
    }
    lock.Unlock();
    if (expand) {
      auto chunks = Expand(*job);
      lock.Lock();
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
      lock.Lock();
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

Result<std::vector<std::pair<ChunkId, uint64_t>>> Prefetcher::Expand(const Job& job) {
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  std::vector<std::pair<ChunkId, uint64_t>> out;
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
  RETURN_IF_ERROR(ForEachFile(txn, job.root, job.recursive, [&](uint64_t, const Manifest& m) {
    for (const Extent& e : m.extents()) {
      if (e.hole() || !seen.insert(e.id).second) continue;
      if (!cache_->OnDisk(e.id)) out.emplace_back(e.id, e.len);
    }
  }));
  return out;
}

Status Prefetcher::FetchOne(const ChunkId& id, uint64_t len) {
  // A file replaced since the job was expanded: its old chunks are not brought back (nothing
  // would reclaim them).
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(id));
    if (r.refs == 0) return Status::Ok();
  }
  return cache_->Warm(id, len);
}

Status Prefetcher::ApplyPins(bool fetch) {
  MutexLock pl(&pin_mu_);
  std::unordered_map<ChunkId, uint64_t, ChunkIdHash> keep;
  std::vector<uint64_t> incomplete;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    for (auto it = pinned_.begin(); it != pinned_.end();) {
      bool missing = false;
      Status st = ForEachFile(txn, *it, true, [&](uint64_t, const Manifest& m) {
        for (const Extent& e : m.extents()) {
          if (e.hole() || !keep.emplace(e.id, e.len).second) continue;
          if (remote_ && !missing && !cache_->OnDisk(e.id)) missing = true;
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
  cache_->SetPinned(std::move(keep));
  if (fetch) {
    for (uint64_t ino : incomplete) Add(ino, true);
  }
  return Status::Ok();
}

Status Prefetcher::LoadPins() {
  {
    MutexLock pl(&pin_mu_);
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    std::unordered_set<uint64_t> seen{kRootIno};
    auto check = [&](uint64_t ino) REQUIRES(pin_mu_) -> Status {
      auto v = txn.GetXattr(ino, kPinXattr);
      if (v.ok() && *v == "1") pinned_.insert(ino);
      return v.ok() || v.status().code() == Code::kNoData ? Status::Ok() : v.status();
    };
    RETURN_IF_ERROR(check(kRootIno));
    RETURN_IF_ERROR(
        txn.WalkTree(kRootIno, true, [&](const DirEntry& e) REQUIRES(pin_mu_) -> Status {
          if (!seen.insert(e.ino).second || !(S_ISDIR(e.mode) || S_ISREG(e.mode))) {
            return Status::Ok();
          }
          return check(e.ino);
        }));
    if (!pinned_.empty()) log_->info("{} pinned files and directories", pinned_.size());
  }
  return ApplyPins(true);
}

Result<CacheUsage> CountCached(MetaStore& meta, const ChunkCache& cache, uint64_t ino) {
  CacheUsage u;
  std::unordered_set<ChunkId, ChunkIdHash> seen;
  ASSIGN_OR_RETURN(auto txn, meta.Begin(false));
  RETURN_IF_ERROR(ForEachFile(txn, ino, true, [&](uint64_t, const Manifest& m) {
    ++u.files;
    for (const Extent& e : m.extents()) {
      if (e.hole() || !seen.insert(e.id).second) continue;
      ++u.chunks;
      u.bytes += e.len;
      if (cache.OnDisk(e.id)) {
        ++u.cached_chunks;
        u.cached_bytes += e.len;
      }
    }
  }));
  return u;
}

}  // namespace ckptfs
