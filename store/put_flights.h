// PutFlights: puts of one chunk that overlap share one write. The first put of a chunk begins a
// flight; a put of the same chunk while that flight is on its way joins it and ends with its
// outcome, with no copy and no disk write of its own (ranks sealing identical files at once, or a
// file repeating a chunk within one seal's window).
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"

namespace ckptfs {

// Thread-safe. Every flight begun (Join returned false) is ended by its owner exactly once, with
// End, or with EndIfUnwanted when that returns true.
class PutFlights {
 public:
  using Done = std::function<void(Status)>;
  // What a put that joined is done with: `stored(len, written)`, `written` being false (the
  // chunk was found stored) or why it is not.
  using Stored = std::function<Status(size_t len, const Result<bool>& written)>;

  // True when a put of `id` is in flight: `done` is moved into it and runs when it ends (the
  // joining put's cut may be given up: `cancelled`, null or valid until `done` runs). Otherwise a
  // flight of `id` begins, and the caller owns it.
  bool Join(const ChunkId& id, size_t len, const std::atomic<bool>* cancelled, Done& done) {
    std::lock_guard lock(mu_);
    auto [it, begun] = flights_.try_emplace(id);
    if (begun) return false;
    it->second.push_back(Joined{len, cancelled, std::move(done)});
    return true;
  }

  // Ends the flight of `id` with the owner's outcome: true, the owner wrote the chunk; false, it
  // was stored already; a failure, the chunk is not stored. Each put that joined finds it stored
  // or shares the failure. The callbacks run after the flight is gone.
  void End(const ChunkId& id, const Result<bool>& written, const Stored& stored) {
    const Result<bool> theirs = written.ok() ? Result<bool>(false) : Result<bool>(written.status());
    for (Joined& j : Take(id, /*only_if_unwanted=*/false)) j.done(stored(j.len, theirs));
  }

  // The owner's cut has been given up: ends the flight (true) when every put that joined it has
  // been given up too, and they fail with `why`. Otherwise (false) the chunk is still wanted and
  // the owner goes on to End.
  bool EndIfUnwanted(const ChunkId& id, const Status& why, const Stored& stored) {
    bool ended = false;
    std::vector<Joined> joined = Take(id, /*only_if_unwanted=*/true, &ended);
    for (Joined& j : joined) j.done(stored(j.len, why));
    return ended;
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return flights_.size();
  }

 private:
  struct Joined {
    size_t len;
    const std::atomic<bool>* cancelled;
    Done done;
  };

  std::vector<Joined> Take(const ChunkId& id, bool only_if_unwanted, bool* ended = nullptr) {
    std::lock_guard lock(mu_);
    auto it = flights_.find(id);
    if (it == flights_.end()) return {};
    if (only_if_unwanted) {
      for (const Joined& j : it->second) {
        if (!j.cancelled || !j.cancelled->load()) return {};
      }
    }
    std::vector<Joined> joined = std::move(it->second);
    flights_.erase(it);
    if (ended) *ended = true;
    return joined;
  }

  mutable std::mutex mu_;
  std::unordered_map<ChunkId, std::vector<Joined>, ChunkIdHash> flights_;  // guarded by mu_
};

}  // namespace ckptfs
