// LocalChunks: the local disk tier's chunks as the store's file writers see them (the ChunkSink
// of every FileWriter the store makes). It stores chunks, each once (a chunk stored already, or
// on its way to the disk, is not written again); it holds every chunk a writer stored until the
// writer's commit or abandonment releases it; and it deletes the chunks that no manifest
// references and no writer holds (Reclaim), once the commits that dropped them are durable.
//
// Thread-safe. Which lock guards what:
//   holds_mu_       holds_ (the writers' holds, by chunk).
//   put_copies_     its own lock: the memory of the chunk copies on their way to the disk, every
//                   cut's together (each cut also keeps to its own FileWriter::kPutWindow).
//   put_flights_    its own lock: the puts in flight, which a put of the same chunk joins.
//   staging_seq_    atomic.
// Lock order: holds_mu_ is a leaf among the store's locks. Callers may hold any store lock
// (OpenFile::mu, the namespace lock) when they call in, and nothing here takes one. Under
// holds_mu_, LocalChunks only reads LMDB (a read transaction) and removes chunk files through
// ChunkCache, which takes only its own lock. The locks inside put_copies_ and put_flights_ are
// never held while calling out: a put's `done` runs with no LocalChunks lock held, on a put
// thread or the caller's. No LocalChunks lock is held across a put's disk write or Reclaim's
// LMDB sync; PutChunkAsync may wait for put_copies_ to have room (back-pressure on the cutting
// thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/chunk_cache.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "store/file_writer.h"
#include "store/memory_budget.h"
#include "store/meta_store.h"
#include "store/put_flights.h"

namespace ckptfs {

class LocalChunks final : public ChunkSink {
 public:
  // The memory the aligned copies of chunks cut from staging files may hold at once, all cuts
  // together (Usage::put_copy_*).
  static constexpr uint64_t kPutCopyLimit = 64 << 20;

  // cache, meta and metrics outlive this. Staging files go under <cache_dir>/staging.
  // put_threads: the threads that write the copied chunks to disk (PutChunkAsync).
  LocalChunks(const std::string& cache_dir, ChunkCache* cache, MetaStore* meta, Metrics* metrics,
              Logger log, unsigned put_threads);
  // Joins the put threads, after they ran the puts still queued.
  ~LocalChunks() override = default;
  LocalChunks(const LocalChunks&) = delete;
  LocalChunks& operator=(const LocalChunks&) = delete;

  // ChunkSink. A put holds its chunk (one hold per put) until ReleaseHolds; a failed put drops
  // its hold itself.
  Status PutChunk(const ChunkId& id, const uint8_t* data, size_t len) override;
  void PutChunkAsync(const ChunkId& id, const uint8_t* data, size_t len,
                     const std::atomic<bool>* cancelled, std::function<void(Status)> done) override;
  Result<ChunkRef> GetChunk(const ChunkId& id, size_t len) override;
  std::string NewStagingPath() override;

  // Holds chunk `id` as a put does, without storing it (a chunk that stays where a seal found it:
  // store/pack_sink.h).
  void Hold(const ChunkId& id);
  // Drops one hold of each chunk in ids (a writer's, FileWriter::held()) and reclaims those no
  // writer holds any more.
  void ReleaseHolds(const std::vector<ChunkId>& ids);
  // Deletes the chunks among ids that no manifest references and no writer holds, after making
  // the commits that dropped their references durable (a machine crash must not bring back a
  // manifest whose chunks are gone). Errors are logged; the chunks concerned stay on disk.
  void Reclaim(const std::vector<ChunkId>& ids);

  // A chunk for a peer node (peers/peer_server.h): the verified bytes of chunk `id` when a file
  // here references it with length `len`, from the local tier, or, when `fetch`, from the
  // remote tiers (sharing the readers' single flight). kNotFound when no file here references
  // it at that length, or it is not local and not to be fetched.
  Result<ChunkRef> Referenced(const ChunkId& id, uint64_t len, bool fetch);

  // What the metrics exporter shows of the puts, read now.
  struct Usage {
    uint64_t put_copy_bytes = 0, put_copy_limit = 0, put_copy_peak = 0;
    uint64_t put_flights = 0;
  };
  Usage usage() const;

 private:
  // A put of PutChunkAsync that owns its chunk's flight (local_chunks.cc).
  struct PutJob;
  // PutChunkAsync's parts: the disk write on put_pool_ (RunPut), its end with the flight's
  // (FinishPut), and its own end (EndJob: its copy and memory go, its callback runs).
  void RunPut(const ChunkId& id, PutJob& job);
  void FinishPut(const ChunkId& id, PutJob& job, const Result<bool>& written);
  void EndJob(const ChunkId& id, PutJob& job, const Result<bool>& written);
  // A put's end, once the local tier answered: the chunk's hold goes when it failed.
  Status Stored(const ChunkId& id, size_t len, const Result<bool>& written);

  const std::string staging_dir_;
  ChunkCache* const cache_;
  MetaStore* const meta_;
  Metrics* const metrics_;
  const Logger log_;
  Mutex holds_mu_;
  std::unordered_map<ChunkId, uint32_t, ChunkIdHash> holds_ GUARDED_BY(holds_mu_);
  MemoryBudget put_copies_;
  PutFlights put_flights_;
  std::atomic<uint64_t> staging_seq_{0};
  // Last: its threads are joined before anything their puts use goes.
  std::unique_ptr<ThreadPool> put_pool_;
};

}  // namespace ckptfs
