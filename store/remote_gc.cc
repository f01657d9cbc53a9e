// RemoteTier: the node's side of the garbage-collection protocol (store/gc.h, docs/gc.md).
//
// A node relies on the backend holding a chunk in two ways: a HEAD that found it, and its own
// mark (ChunkRecord::remote) that skips even the HEAD. Either may go stale when a collector
// deletes the chunk. So, before either, gc/round must have been read within the window, and:
// - while a round is active, a file naming a chunk it condemned is not published (kBusy: the
//   queue retries it) until the round is over, and the condemned chunks lose their marks at once
//   (local copies a local file names are fetched back before the sweep, and stay);
// - a publish whose window overran retries once it has seen the round that began meanwhile;
// - a round this node did not see while it was active (offline, a fresh cache) makes it check
//   every mark against the backend before it relies on any.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <unordered_set>
#include <thread>

#include "store/gc.h"
#include "store/remote_tier.h"

namespace ckptfs {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Status RemoteTier::RefreshGc(bool force) {
  if (!force && gc_.read && Since(gc_.read_at) < gc_window_s_ / 2) {
    return gc_.fetch_pending ? UnmarkCondemned(true) : Status::Ok();
  }
  const auto sent = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(GcRound round, ReadGcRound(*backend_));
  uint64_t done;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(done, txn.GetGcEpoch(tier_));
  }
  if (gc_.active) {
    const bool over = round.epoch != gc_.epoch || !round.active;
    // A collector that promised to delete nothing after deadline_s and is still "active" well
    // past it has gone away: its round is over.
    const bool expired = !over && Since(gc_.active_since) > 1.1 * gc_.deadline_s + gc_window_s_;
    if (expired) {
      log_->warn("gc round {} is still active {:.0f} s after this node saw it begin; its collector "
                 "is gone, so the round counts as over", gc_.epoch, Since(gc_.active_since));
      gc_.expired = gc_.epoch;
    }
    if (over || expired) {
      RETURN_IF_ERROR(EndGcRound());
      done = gc_.epoch;
    }
  }
  if (!gc_.active && round.epoch > done) {
    // Rounds before this one ran while this node was not looking: its marks may name chunks
    // they deleted.
    if (round.epoch > done + 1 || !round.active || round.epoch == gc_.expired) {
      ++gc_generation_;
      RETURN_IF_ERROR(RevalidateMarks());
    }
    if (round.active && round.epoch != gc_.expired) {
      ASSIGN_OR_RETURN(gc_.condemned, ReadCondemned(*backend_, round.epoch));
      ++gc_generation_;  // before any mark is cleared: a sync that read before now sets none
      gc_.active = true;
      gc_.active_since = sent;
      gc_.deadline_s = round.deadline_s;
      gc_.epoch = round.epoch;
      log_->info("gc round {} condemned {} chunks; files naming them wait for its end", round.epoch,
                 gc_.condemned.size());
      RETURN_IF_ERROR(UnmarkCondemned(true));
    } else {
      ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
      RETURN_IF_ERROR(txn.PutGcEpoch(tier_, round.epoch));
      RETURN_IF_ERROR(txn.Commit());
    }
  }
  gc_.epoch = round.epoch;
  gc_.read = true;
  gc_.read_at = sent;
  return gc_.fetch_pending ? UnmarkCondemned(true) : Status::Ok();
}

Status RemoteTier::EndGcRound() {
  ++gc_generation_;
  // Marks again (a fetch during the round may have set one), then the round is done here.
  RETURN_IF_ERROR(UnmarkCondemned(false));
  cache_->SetProtected(tier_, {});
  ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
  RETURN_IF_ERROR(txn.PutGcEpoch(tier_, gc_.epoch));
  RETURN_IF_ERROR(txn.Commit());
  gc_.active = false;
  gc_.fetch_pending = false;
  gc_.condemned.clear();
  gc_.condemned.shrink_to_fit();
  return Status::Ok();
}

Status RemoteTier::UnmarkCondemned(bool fetch_back) {
  // Condemned chunks a local file names, with their length (0: another tier holds it too).
  std::vector<std::pair<ChunkId, uint64_t>> named;
  {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    for (const ChunkId& id : gc_.condemned) {
      ASSIGN_OR_RETURN(ChunkRecord r, txn.GetChunk(id));
      if (r.refs == 0) continue;
      RETURN_IF_ERROR(txn.ClearChunkRemote(id, tier_));
      // Another tier's copy serves it (its own rounds are followed by its own RemoteTier).
      named.emplace_back(id, (r.tiers & ~(1u << tier_)) ? 0 : r.len);
    }
    RETURN_IF_ERROR(txn.Commit());
  }
  gc_.fetch_pending = false;
  if (fetch_back) {
    // Until the round ends no eviction takes them, even if a read's fetch or the namespace sync
    // marks one as held again meanwhile.
    std::unordered_set<ChunkId, ChunkIdHash> keep;
    for (const auto& [id, len] : named) keep.insert(id);
    cache_->SetProtected(tier_, keep);
  }
  for (const auto& [id, len] : named) {
    cache_->UnmarkRemote(id, tier_);
    if (!fetch_back || len == 0 || cache_->OnDisk(id)) continue;
    // Evicted while the backend held it; the sweep will delete it: this node's copy is the one
    // its file keeps.
    Status st = cache_->Warm(id, len);
    cache_->UnmarkRemote(id, tier_);
    if (st.ok() && !cache_->OnDisk(id)) st = IoError("fetched but not kept on the local tier");
    if (!st.ok()) {
      gc_.fetch_pending = true;
      log_->error("gc round {} condemned chunk {}, which a file here names, and fetching it back "
                  "failed: {}; trying again", gc_.epoch, id.Hex(), st.ToString());
    }
  }
  return Status::Ok();
}

Status RemoteTier::RevalidateMarks() {
  std::vector<std::pair<ChunkId, uint64_t>> marked;
  {
    // A write transaction: it waits for a namespace sync that checked gc_generation before it
    // moved, so the marks that sync sets are among those checked.
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    RETURN_IF_ERROR(txn.ForEachChunk([&](const ChunkId& id, const ChunkRecord& r) {
      if (r.tiers & (1u << tier_)) marked.emplace_back(id, r.len);
    }));
  }
  if (marked.empty()) return Status::Ok();
  log_->info("a gc round ran unseen: checking {} chunks this node counted as held by {}",
             marked.size(), backend_->Describe());
  struct Batch {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    Status first;
    std::vector<ChunkId> gone;
  } batch;
  batch.left = marked.size();
  for (const auto& [id, len] : marked) {
    upload_pool_->Submit([this, &batch, id = id, len = len] {
      auto head = Tried([&] { return backend_->Head(ChunkCache::ObjectKey(id)); });
      std::lock_guard lock(batch.mu);
      if (!head.ok() && head.status().code() == Code::kNotFound) {
        batch.gone.push_back(id);
      } else if (head.ok() && head->size != len) {
        batch.gone.push_back(id);
      } else if (!head.ok() && batch.first.ok()) {
        batch.first = head.status();
      }
      if (--batch.left == 0) batch.cv.notify_all();
    });
  }
  std::unique_lock lock(batch.mu);
  batch.cv.wait(lock, [&] { return batch.left == 0; });
  if (!batch.gone.empty()) {
    ASSIGN_OR_RETURN(auto txn, meta_->Begin(true));
    for (const ChunkId& id : batch.gone) RETURN_IF_ERROR(txn.ClearChunkRemote(id, tier_));
    RETURN_IF_ERROR(txn.Commit());
  }
  for (const ChunkId& id : batch.gone) {
    cache_->UnmarkRemote(id, tier_);
    if (!cache_->OnDisk(id)) {
      log_->error("chunk {} is gone from {} and from this node's local tier: unless another "
                  "tier holds it, the files here that name it cannot be read (ckptfs fsck lists "
                  "them)", id.Hex(), backend_->Describe());
    }
  }
  if (!batch.gone.empty()) {
    log_->info("{} of them were deleted by a gc round; they are uploaded again with their files",
               batch.gone.size());
  }
  return batch.first;  // not all checked: the next refresh checks again
}

Status RemoteTier::CheckGc(const Manifest& m) const {
  if (!gc_.active) return Status::Ok();
  for (const Extent& e : m.extents()) {
    if (!e.hole() && std::binary_search(gc_.condemned.begin(), gc_.condemned.end(), e.id)) {
      return Status(Code::kBusy, std::string(kGcWait) + std::to_string(gc_.epoch) +
                                     " condemned chunk " + e.id.Hex() +
                                     " of this file: it waits for the round to end");
    }
  }
  return Status::Ok();
}

}  // namespace ckptfs
