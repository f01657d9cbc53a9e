#include "peers/peer_directory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

namespace ckptfs {
namespace {

constexpr int64_t kForgetAfterS = 600;  // a dead node's record is deleted after this
constexpr int64_t kFreshS = 30;         // a record this young is live

std::string RecordKey(const std::string& self, std::time_t now) {
  char t[24];
  std::snprintf(t, sizeof(t), "%020lld", static_cast<long long>(now));
  return std::string(PeerDirectory::kPrefix) + self + "/" + t;
}

// "nodes/<address>/<time>" -> address and time; false for any other key.
bool ParseRecord(const std::string& key, std::string* addr, int64_t* time) {
  const size_t plen = std::string_view(PeerDirectory::kPrefix).size();
  const size_t slash = key.rfind('/');
  if (slash == std::string::npos || slash <= plen || key.size() - slash - 1 != 20) return false;
  const std::string t = key.substr(slash + 1);
  if (t.find_first_not_of("0123456789") != std::string::npos) return false;
  *addr = key.substr(plen, slash - plen);
  *time = std::stoll(t);
  return addr->find('/') == std::string::npos;
}

}  // namespace

PeerDirectory::PeerDirectory(Backend* store, std::string self, double heartbeat_s,
                             OnChange on_change)
    : store_(store),
      self_(std::move(self)),
      heartbeat_s_(heartbeat_s),
      on_change_(std::move(on_change)),
      log_(GetLogger("peers")) {}

PeerDirectory::~PeerDirectory() { Stop(); }

void PeerDirectory::Refresh(std::time_t now) {
  if (!self_.empty()) {
    const std::string key = RecordKey(self_, now);
    std::string old;
    {
      MutexLock lock(&mu_);
      old = record_;
    }
    if (key != old) {
      if (Status st = store_->Put(key, "", 0); !st.ok()) {
        log_->warn("putting this node's record {}: {}", key, st.ToString());
      } else {
        if (!old.empty()) (void)store_->Delete(old);
        MutexLock lock(&mu_);
        record_ = key;
      }
    }
  }
  // Three heartbeats, and never under kFreshS: a busy node's refresh may come late.
  const auto fresh = std::max<int64_t>(static_cast<int64_t>(3 * heartbeat_s_), kFreshS);
  std::set<std::string> live;
  std::vector<std::string> dead;
  Status st = store_->List(kPrefix, "", [&](const ObjectInfo& info) {
    std::string addr;
    int64_t t = 0;
    if (!ParseRecord(info.key, &addr, &t) || addr == self_) return true;
    const int64_t age = static_cast<int64_t>(now) - t;
    if (age <= fresh && age >= -fresh) live.insert(addr);
    if (age > kForgetAfterS) dead.push_back(info.key);
    return true;
  });
  if (!st.ok()) {
    log_->warn("listing the nodes' records: {}", st.ToString());
    return;
  }
  for (const std::string& key : dead) (void)store_->Delete(key);
  std::vector<std::string> now_live(live.begin(), live.end());
  {
    MutexLock lock(&mu_);
    if (now_live == live_) return;
    for (const std::string& a : now_live) {
      if (!std::binary_search(live_.begin(), live_.end(), a)) log_->info("peer {} joined", a);
    }
    for (const std::string& a : live_) {
      if (!live.count(a)) log_->info("peer {} left (no fresh record)", a);
    }
    live_ = now_live;
  }
  on_change_(now_live);
}

void PeerDirectory::Start() {
  Refresh(std::time(nullptr));
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(stop_mu_);
    const auto every = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_s_ * 1000));
    while (!stop_cv_.wait_for(lock, every, [this] { return stopping_; })) {
      lock.unlock();
      Refresh(std::time(nullptr));
      lock.lock();
    }
  });
}

void PeerDirectory::Stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::string record;
  {
    MutexLock lock(&mu_);
    record.swap(record_);
  }
  if (!record.empty()) (void)store_->Delete(record);
}

}  // namespace ckptfs
