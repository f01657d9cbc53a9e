#include "store/local_chunks.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <exception>
#include <optional>
#include <utility>

namespace ckptfs {

LocalChunks::LocalChunks(const std::string& cache_dir, ChunkCache* cache, MetaStore* meta,
                         Metrics* metrics, Logger log, unsigned put_threads)
    : staging_dir_(cache_dir + "/staging"),
      cache_(cache),
      meta_(meta),
      metrics_(metrics),
      log_(std::move(log)),
      put_copies_(kPutCopyLimit),
      put_pool_(std::make_unique<ThreadPool>(put_threads)) {}

LocalChunks::Usage LocalChunks::usage() const {
  Usage u;
  u.put_copy_bytes = put_copies_.used();
  u.put_copy_limit = put_copies_.limit();
  u.put_copy_peak = put_copies_.peak();
  u.put_flights = put_flights_.size();
  return u;
}

Status LocalChunks::PutChunk(const ChunkId& id, const uint8_t* data, size_t len) {
  {
    MutexLock lock(&holds_mu_);
    ++holds_[id];
  }
  return Stored(id, len, cache_->Put(id, data, len));
}

// A put of PutChunkAsync that owns its chunk's flight: what it holds until it ends.
struct LocalChunks::PutJob {
  size_t len;
  const std::atomic<bool>* cancelled;
  std::function<void(Status)> done;
  uint64_t cost = 0;  // taken from put_copies_
  std::unique_ptr<ChunkCache::PreparedPut> prepared;
};

void LocalChunks::PutChunkAsync(const ChunkId& id, const uint8_t* data, size_t len,
                                const std::atomic<bool>* cancelled,
                                std::function<void(Status)> done) {
  {
    MutexLock lock(&holds_mu_);
    ++holds_[id];
  }
  auto job = std::make_shared<PutJob>(PutJob{len, cancelled, std::move(done)});
  // The same chunk already on its way to the disk: this put ends with that one.
  if (put_flights_.Join(id, len, cancelled, job->done)) return;
  // This put owns the flight of `id`, and ends it however it ends. A copy is made here, within
  // put_copies_ (data is the caller's again on return; back-pressure on the cutting thread),
  // and written on put_pool_. A chunk stored already, a small one, or one written buffered
  // needs no copy: it is put now.
  std::optional<Result<bool>> now;
  try {
    if (!cache_->PutCopies(id, len)) {
      now = cache_->Put(id, data, len);
    } else {
      job->cost = ChunkCache::CopyFootprint(len);
      put_copies_.Take(job->cost);
      job->prepared = cache_->PreparePut(data, len);
      if (job->prepared) {
        put_pool_->Submit([this, id, job] { RunPut(id, *job); });
      } else {
        now = cache_->Put(id, data, len);
      }
    }
  } catch (const std::exception& e) {
    now = Status(Code::kIo, "put of chunk " + id.Hex() + ": " + e.what());
  }
  if (now) FinishPut(id, *job, *now);
}

void LocalChunks::RunPut(const ChunkId& id, PutJob& job) {
  auto stored = [&](size_t len, const Result<bool>& r) { return Stored(id, len, r); };
  Result<bool> written = false;
  try {
    // A cut given up skips its puts not yet begun, unless another cut still wants the chunk.
    if (job.cancelled && job.cancelled->load()) {
      Status why(Code::kIo, "put of chunk " + id.Hex() + " cancelled");
      if (put_flights_.EndIfUnwanted(id, why, stored)) return EndJob(id, job, why);
    }
    written = cache_->PutPrepared(id, *job.prepared);
  } catch (const std::exception& e) {
    written = Status(Code::kIo, "put of chunk " + id.Hex() + ": " + e.what());
  }
  FinishPut(id, job, written);
}

void LocalChunks::FinishPut(const ChunkId& id, PutJob& job, const Result<bool>& written) {
  put_flights_.End(id, written, [&](size_t len, const Result<bool>& r) { return Stored(id, len, r); });
  EndJob(id, job, written);
}

void LocalChunks::EndJob(const ChunkId& id, PutJob& job, const Result<bool>& written) {
  job.prepared.reset();
  put_copies_.Release(std::exchange(job.cost, 0));
  job.done(Stored(id, job.len, written));
}

Status LocalChunks::Stored(const ChunkId& id, size_t len, const Result<bool>& written) {
  if (!written.ok()) {
    ReleaseHolds({id});
    if (written.status().code() == Code::kNoSpace) {
      log_->error("the local tier is full: {}", written.status().ToString());
    }
    return written.status();
  }
  if (!*written) {
    metrics_->chunk_dedup_hits.Add(1);
    metrics_->chunk_dedup_bytes.Add(len);
  }
  return Status::Ok();
}

Result<ChunkRef> LocalChunks::GetChunk(const ChunkId& id, size_t len) { return cache_->Get(id, len); }

std::string LocalChunks::NewStagingPath() {
  return staging_dir_ + "/" + std::to_string(::getpid()) + "." + std::to_string(++staging_seq_);
}

void LocalChunks::Hold(const ChunkId& id) {
  MutexLock lock(&holds_mu_);
  ++holds_[id];
}

void LocalChunks::ReleaseHolds(const std::vector<ChunkId>& ids) {
  std::vector<ChunkId> unheld;
  {
    MutexLock lock(&holds_mu_);
    for (const ChunkId& id : ids) {
      auto it = holds_.find(id);
      if (it == holds_.end()) continue;
      if (--it->second == 0) {
        holds_.erase(it);
        unheld.push_back(id);
      }
    }
  }
  Reclaim(unheld);
}

void LocalChunks::Reclaim(const std::vector<ChunkId>& ids) {
  if (ids.empty()) return;
  // Find the candidates, make the commits that dropped their last references durable, then
  // delete those still unreferenced and unheld. The final check runs under holds_mu_, so that no
  // writer can start holding a chunk between the check and the unlink.
  auto unreferenced = [&](const std::vector<ChunkId>& in) REQUIRES(holds_mu_) {
    std::vector<ChunkId> out;
    auto txn = meta_->Begin(false);
    if (!txn.ok()) {
      log_->error("reclaiming chunks: {}", txn.status().ToString());
      return out;
    }
    for (const ChunkId& id : in) {
      if (holds_.count(id)) continue;
      auto rec = txn->GetChunk(id);
      if (rec.ok() && rec->refs == 0) out.push_back(id);
    }
    return out;
  };
  std::vector<ChunkId> dead;
  {
    MutexLock lock(&holds_mu_);
    dead = unreferenced(ids);
  }
  if (dead.empty()) return;
  if (Status st = meta_->Sync(); !st.ok()) {
    log_->error("not reclaiming {} chunks: {}", dead.size(), st.ToString());
    return;
  }
  {
    MutexLock lock(&holds_mu_);
    // All at once: the extents of one pack cost one sync of its index.
    const std::vector<ChunkId> going = unreferenced(dead);
    const std::vector<Status> removed = cache_->RemoveMany(going);
    for (size_t i = 0; i < going.size(); ++i) {
      if (removed[i].ok()) {
        metrics_->chunks_reclaimed.Add(1);
      } else {
        log_->error("reclaiming chunk {}: {}", going[i].Hex(), removed[i].ToString());
      }
    }
  }
  cache_->CompactSoon();  // packs left sparse: their last chunks move into chunk files
}

Result<ChunkRef> LocalChunks::Referenced(const ChunkId& id, uint64_t len, bool fetch) {
  {
    // Only chunks a file here names, at their length: a request for other bytes never reaches
    // the disk (a wrong length would read a good chunk file as corrupt and move it aside).
    ASSIGN_OR_RETURN(MetaStore::Txn txn, meta_->Begin(false));
    ASSIGN_OR_RETURN(ChunkRecord rec, txn.GetChunk(id));
    if (rec.refs == 0 || rec.len != len) {
      return NotFound("chunk " + id.Hex() + " is not referenced here at that length");
    }
  }
  if (!fetch && !cache_->OnDisk(id)) return NotFound("chunk " + id.Hex() + " is not local");
  return cache_->Get(id, len);
}

}  // namespace ckptfs
