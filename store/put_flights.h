// PutFlights: puts of one chunk that overlap share one write. The first put of a chunk begins a
// flight; a put of the same chunk while that flight is on its way joins it and ends with its
// outcome, with no copy and no disk write of its own (ranks sealing identical files at once, or a
// file repeating a chunk within one seal's window).
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"

namespace ckptfs {

// Thread-safe. Every flight begun (Join returned false) is ended by its owner, with End or
// EndIfAlone, exactly once.
class PutFlights {
 public:
  using Done = std::function<void(Status)>;
  struct Joined {
    size_t len;
    Done done;
  };

  // True when a put of `id` is in flight: `done` is moved into it and runs when it ends. Otherwise
  // a flight of `id` begins, and the caller owns it.
  bool Join(const ChunkId& id, size_t len, Done& done) {
    std::lock_guard lock(mu_);
    auto [it, begun] = flights_.try_emplace(id);
    if (begun) return false;
    it->second.push_back(Joined{len, std::move(done)});
    return true;
  }

  // Ends the flight of `id` if no put joined it (true). A put that its own cut no longer needs is
  // skipped this way; once another put waits on it, it is written after all.
  bool EndIfAlone(const ChunkId& id) {
    std::lock_guard lock(mu_);
    auto it = flights_.find(id);
    if (it == flights_.end() || !it->second.empty()) return false;
    flights_.erase(it);
    return true;
  }

  // Ends the flight of `id`; returns the puts that joined it, for the owner to finish with the
  // flight's outcome (outside any lock of its own).
  std::vector<Joined> End(const ChunkId& id) {
    std::lock_guard lock(mu_);
    auto it = flights_.find(id);
    if (it == flights_.end()) return {};
    std::vector<Joined> joined = std::move(it->second);
    flights_.erase(it);
    return joined;
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return flights_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<ChunkId, std::vector<Joined>, ChunkIdHash> flights_;  // guarded by mu_
};

}  // namespace ckptfs
