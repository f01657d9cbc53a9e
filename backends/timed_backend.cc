#include "backends/timed_backend.h"

#include <chrono>
#include <utility>

namespace ckptfs {
namespace {

Outcome OutcomeOf(const Status& st) {
  if (st.ok()) return Outcome::kOk;
  return st.code() == Code::kNotFound ? Outcome::kNotFound : Outcome::kError;
}

template <typename T>
const Status& StatusOf(const Result<T>& r) {
  static const Status kOk = Status::Ok();
  return r.ok() ? kOk : r.status();
}
const Status& StatusOf(const Status& st) { return st; }

}  // namespace

TimedBackend::TimedBackend(std::unique_ptr<Backend> base, Metrics* metrics, int tier)
    : base_(std::move(base)), metrics_(metrics), tier_(tier) {}

template <typename Fn>
auto TimedBackend::Timed(BackendRequest op, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  auto result = fn();
  metrics_->backend(tier_, op, OutcomeOf(StatusOf(result)))
      .Observe(std::chrono::steady_clock::now() - t0);
  return result;
}

Status TimedBackend::Put(const std::string& key, const void* data, size_t len) {
  return Timed(BackendRequest::kPut, [&] { return base_->Put(key, data, len); });
}

Status TimedBackend::PutIfAbsent(const std::string& key, const void* data, size_t len) {
  return Timed(BackendRequest::kPut, [&] { return base_->PutIfAbsent(key, data, len); });
}

Result<size_t> TimedBackend::Get(const std::string& key, uint64_t offset, void* buf, size_t len) {
  return Timed(BackendRequest::kGet, [&] { return base_->Get(key, offset, buf, len); });
}

Result<size_t> TimedBackend::GetExact(const std::string& key, void* buf, size_t len) {
  return Timed(BackendRequest::kGet, [&] { return base_->GetExact(key, buf, len); });
}

Result<std::string> TimedBackend::GetObject(const std::string& key) {
  return Timed(BackendRequest::kGet, [&] { return base_->GetObject(key); });
}

Result<ObjectInfo> TimedBackend::Head(const std::string& key) {
  return Timed(BackendRequest::kHead, [&] { return base_->Head(key); });
}

Status TimedBackend::Delete(const std::string& key) {
  return Timed(BackendRequest::kDelete, [&] { return base_->Delete(key); });
}

Status TimedBackend::List(const std::string& prefix, const std::string& start_after,
                          const std::function<bool(const ObjectInfo&)>& fn) {
  return Timed(BackendRequest::kList, [&] { return base_->List(prefix, start_after, fn); });
}

}  // namespace ckptfs
