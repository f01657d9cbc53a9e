#include "backends/mem_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ckptfs {

namespace {

// How many entries List copies out of the map per visit under the mutex.
constexpr size_t kListBatch = 256;

}  // namespace

ObjectInfo MemBackend::Info(const std::string& key, const Object& object) {
  return ObjectInfo{key, object.bytes->size(), std::to_string(object.generation)};
}

MemBackend::MemBackend(std::string name) : name_(std::move(name)) {}

MemBackend::Bytes MemBackend::Find(const std::string& key) const {
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second.bytes;
}

Status MemBackend::Put(const std::string& key, const void* data, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  // The copy happens before the lock: the caller's buffer is theirs again once Put returns.
  auto bytes = std::make_shared<const std::string>(static_cast<const char*>(data), len);
  std::lock_guard lock(mu_);
  Object& slot = objects_[key];
  if (slot.bytes) stored_bytes_ -= slot.bytes->size();
  slot.bytes = std::move(bytes);
  slot.generation = ++puts_ever_;
  stored_bytes_ += len;
  stats_.puts++;
  stats_.put_bytes += len;
  return Status::Ok();
}

Status MemBackend::PutIfAbsent(const std::string& key, const void* data, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  auto bytes = std::make_shared<const std::string>(static_cast<const char*>(data), len);
  std::lock_guard lock(mu_);
  stats_.puts++;
  Object& slot = objects_[key];
  if (slot.bytes) return Status(Code::kExists, key + " exists in " + name_);
  slot.bytes = std::move(bytes);
  slot.generation = ++puts_ever_;
  stored_bytes_ += len;
  stats_.put_bytes += len;
  return Status::Ok();
}

Result<size_t> MemBackend::Get(const std::string& key, uint64_t offset, void* buf, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  Bytes bytes;
  {
    std::lock_guard lock(mu_);
    stats_.gets++;
    bytes = Find(key);
  }
  if (!bytes) return NotFound("no object " + key + " in " + Describe());
  if (offset >= bytes->size()) return size_t{0};
  size_t n = std::min<uint64_t>(len, bytes->size() - offset);
  std::memcpy(buf, bytes->data() + offset, n);
  std::lock_guard lock(mu_);
  stats_.get_bytes += n;
  return n;
}

Result<std::string> MemBackend::GetObject(const std::string& key) {
  // One snapshot, so unlike the default (Head, then Get) it cannot see the object change size.
  RETURN_IF_ERROR(CheckKey(key));
  Bytes bytes;
  {
    std::lock_guard lock(mu_);
    stats_.gets++;
    bytes = Find(key);
    if (bytes) stats_.get_bytes += bytes->size();
  }
  if (!bytes) return NotFound("no object " + key + " in " + Describe());
  return *bytes;
}

Result<ObjectInfo> MemBackend::Head(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  std::lock_guard lock(mu_);
  stats_.heads++;
  auto it = objects_.find(key);
  if (it == objects_.end()) return NotFound("no object " + key + " in " + Describe());
  return Info(it->first, it->second);
}

Status MemBackend::Delete(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  std::lock_guard lock(mu_);
  stats_.deletes++;
  auto it = objects_.find(key);
  if (it != objects_.end()) {
    stored_bytes_ -= it->second.bytes->size();
    objects_.erase(it);
  }
  return Status::Ok();
}

Status MemBackend::List(const std::string& prefix, const std::string& start_after,
                        const std::function<bool(const ObjectInfo&)>& fn) {
  {
    std::lock_guard lock(mu_);
    stats_.lists++;
  }
  // Keys that qualify are >= prefix (they form one contiguous run from there) and > start_after.
  // The cursor is where the next batch starts: the last key handed out, so keys put or deleted
  // between batches never repeat or go backwards.
  bool inclusive = start_after < prefix;
  std::string cursor = inclusive ? prefix : start_after;
  std::vector<ObjectInfo> batch;
  while (true) {
    batch.clear();
    {
      std::lock_guard lock(mu_);
      auto it = inclusive ? objects_.lower_bound(cursor) : objects_.upper_bound(cursor);
      for (; it != objects_.end() && batch.size() < kListBatch; ++it) {
        if (it->first.compare(0, prefix.size(), prefix) != 0) break;
        batch.push_back(Info(it->first, it->second));
      }
    }
    for (const ObjectInfo& info : batch) {
      if (!fn(info)) return Status::Ok();
    }
    if (batch.size() < kListBatch) return Status::Ok();
    cursor = batch.back().key;
    inclusive = false;
  }
}

std::string MemBackend::Describe() const { return "mem://" + name_; }

MemBackend::Stats MemBackend::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void MemBackend::ResetStats() {
  std::lock_guard lock(mu_);
  stats_ = Stats();
}

size_t MemBackend::object_count() const {
  std::lock_guard lock(mu_);
  return objects_.size();
}

uint64_t MemBackend::stored_bytes() const {
  std::lock_guard lock(mu_);
  return stored_bytes_;
}

std::vector<std::string> MemBackend::Keys() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> keys;
  keys.reserve(objects_.size());
  for (const auto& [key, object] : objects_) keys.push_back(key);
  return keys;
}

}  // namespace ckptfs
