// A backend that times every request into a store's metrics (tier, kind, outcome) and forwards
// it unchanged: the exporter's ckptfs_backend_request_seconds.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "common/metrics.h"

namespace ckptfs {

class TimedBackend : public Backend {
 public:
  // Owns `base`; `metrics` outlives this object; tier < kMetricTiers.
  TimedBackend(std::unique_ptr<Backend> base, Metrics* metrics, int tier);

  Status Put(const std::string& key, const void* data, size_t len) override;
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override;
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override;
  Result<size_t> GetExact(const std::string& key, void* buf, size_t len) override;
  Result<std::string> GetObject(const std::string& key) override;
  Result<ObjectInfo> Head(const std::string& key) override;
  Status Delete(const std::string& key) override;
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override;
  std::string Describe() const override { return base_->Describe(); }
  std::string Identity() const override { return base_->Identity(); }

 private:
  template <typename Fn>
  auto Timed(BackendRequest op, Fn&& fn);

  std::unique_ptr<Backend> base_;
  Metrics* const metrics_;
  const int tier_;
};

}  // namespace ckptfs
