// MemBackend: the in-memory twin of the remote tier, for unit tests (LevelDB's NewMemEnv, JuiceFS
// mem.go). It follows the whole Backend contract, so a test that passes against it exercises the
// same promises the posix and s3 backends keep; its counters let a test see how the layer above
// talks to the remote tier (how many requests, how many bytes).
//
// ObjectInfo::version is the number of the Put that stored the object, counted per MemBackend.
//
// Thread-safe. Objects are shared immutable byte strings: a Put swaps in a new one under the
// mutex, and a Get copies from the one it found, outside the mutex, so a reader never sees a torn
// object and a large copy does not block other callers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace ckptfs {

class MemBackend : public Backend {
 public:
  // Requests the backend has answered (valid keys only; an invalid key counts nowhere) and the
  // payload bytes they moved.
  struct Stats {
    uint64_t puts = 0;
    uint64_t gets = 0;  // Get calls, including those GetObject makes
    uint64_t heads = 0;
    uint64_t deletes = 0;
    uint64_t lists = 0;
    uint64_t put_bytes = 0;
    uint64_t get_bytes = 0;
  };

  // `name` only shows in Describe() ("mem://name"), to tell several instances apart in logs.
  explicit MemBackend(std::string name = "");

  Status Put(const std::string& key, const void* data, size_t len) override;
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override;
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override;
  Result<std::string> GetObject(const std::string& key) override;
  Result<ObjectInfo> Head(const std::string& key) override;
  Status Delete(const std::string& key) override;
  // fn runs without the mutex held, so it may call back into the backend (a GC that deletes
  // what it lists); the listing walks the map in batches from a cursor, like S3 pages.
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override;
  std::string Describe() const override;

  // Test hooks.
  Stats stats() const;
  void ResetStats();
  size_t object_count() const;
  uint64_t stored_bytes() const;          // sum of the sizes of the objects held now
  std::vector<std::string> Keys() const;  // every key, in ascending byte order

 private:
  using Bytes = std::shared_ptr<const std::string>;
  struct Object {
    Bytes bytes;
    uint64_t generation = 0;  // ObjectInfo::version: which Put stored these bytes
  };
  Bytes Find(const std::string& key) const;
  static ObjectInfo Info(const std::string& key, const Object& object);

  const std::string name_;
  mutable std::mutex mu_;                  // guards everything below
  std::map<std::string, Object> objects_;  // std::string's operator< is byte order, as List needs
  uint64_t stored_bytes_ = 0;
  uint64_t puts_ever_ = 0;  // the last generation handed out
  Stats stats_;
};

}  // namespace ckptfs
