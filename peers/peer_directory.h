// PeerDirectory: nodes find each other through the bucket. Each node with a peer address keeps
// a record "nodes/<address>/<20-digit unix time>" (empty), put anew every `heartbeat_s` (the old
// one deleted), and lists "nodes/" as often: the live peers are the addresses with a record
// less than three heartbeats (at least 30 s) old. One LIST, one PUT and one DELETE per node per heartbeat,
// whatever the number of nodes; no GET. A record left by a node that died is ignored once
// stale and deleted by whoever lists it ten minutes on.
//
// Thread-safe; runs one thread of its own from Start to Stop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "common/log.h"
#include "common/mutex.h"

namespace ckptfs {

class PeerDirectory {
 public:
  // Told the live peers (sorted, without `self`) after every refresh that changed them.
  using OnChange = std::function<void(const std::vector<std::string>& live)>;
  // `store` (the bucket) outlives this object. `self` empty: this node lists, publishes none.
  PeerDirectory(Backend* store, std::string self, double heartbeat_s, OnChange on_change);
  ~PeerDirectory();

  // Puts this node's record and lists the others', as of `now`; then tells OnChange if the
  // live set changed. Errors are logged and leave the last set in place.
  void Refresh(std::time_t now);
  // A refresh now, then one every heartbeat on a thread of its own.
  void Start();
  // Ends the thread and deletes this node's record.
  void Stop();

  static constexpr const char* kPrefix = "nodes/";

 private:
  Backend* const store_;
  const std::string self_;
  const double heartbeat_s_;
  const OnChange on_change_;
  Logger log_;
  Mutex mu_;
  std::string record_ GUARDED_BY(mu_);        // this node's record now
  std::vector<std::string> live_ GUARDED_BY(mu_);
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // guarded by stop_mu_
  std::thread thread_;
};

}  // namespace ckptfs
