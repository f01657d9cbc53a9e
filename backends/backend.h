// Backend: the remote tier. A flat namespace of immutable-by-convention objects named by
// '/'-separated keys ("chunks/ab/<id>", "manifests/<...>"), like an S3 bucket under a prefix.
//
// Implementations: posix (a directory, e.g. on Lustre/NFS/GPFS), s3 (any S3-compatible store),
// mem (in memory, for unit tests) and a fault-injecting wrapper. One conformance suite
// (tests/backends/backend_conformance.h) runs against every one of them.
//
// Contract shared by every implementation:
// - Thread-safe: any call may run concurrently with any other from many threads.
// - Idempotent: repeating a call that succeeded (or whose outcome is unknown) is always safe. A
//   Put replaces the whole object; a Delete of an absent key succeeds.
// - Atomic objects: once Put returns OK, every later Get or Head from any client sees all of the
//   new bytes or (for a concurrent reader) all of the old ones, never a mix or a torn object.
// - Keys: 1..1024 bytes, no leading '/', no empty path component, no "." or ".." component, no
//   NUL or newline. Anything else is kInvalid.
// - Errors: kNotFound for a missing object (expected, not logged as an error); kIo for transport
//   or server failures that persisted through the implementation's retries; kInvalid for a bad
//   key or argument; kPermission for refused credentials; kCorrupt when the backend answered
//   something that cannot be right (a short body, a size it did not promise).
// - Backends never verify chunk hashes: the caller names chunks by content and verifies what it
//   reads (invariant 1), so a backend that lies is caught one level up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckptfs {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  // Changes whenever the object is replaced (S3: its ETag; posix: file identity and mtime);
  // empty where the backend cannot tell. Lets a reader of List see a rewrite of the same size.
  std::string version;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Stores data[0..len) as `key`, replacing any object of that name. OK means durable in the
  // backend and visible to every client.
  virtual Status Put(const std::string& key, const void* data, size_t len) = 0;
  // Stores `key` only if there is no object of that name: kExists when there is. Of concurrent
  // calls for one key, exactly one stores its bytes. Not idempotent like Put: a call retried
  // after a lost answer may get kExists for its own earlier success, so a caller that must know
  // reads the object back and compares. (S3: PUT with If-None-Match: *.)
  virtual Status PutIfAbsent(const std::string& key, const void* data, size_t len) = 0;

  // Reads up to `len` bytes of `key` starting at `offset` into buf. Returns the number of bytes
  // read: `len`, or fewer when the object ends first (0 when offset is at or past its end).
  // kNotFound when there is no such object.
  virtual Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) = 0;

  // Get of a whole object whose length is known to be `len` (a chunk object), from its start:
  // the bytes read, fewer when the object is shorter. The default is Get(key, 0, buf, len). S3
  // asks for the object without a Range (radosgw serves a whole small object with one read of
  // its store, a ranged GET with two), and fails with kCorrupt when it is longer than `len`.
  virtual Result<size_t> GetExact(const std::string& key, void* buf, size_t len) {
    return Get(key, 0, buf, len);
  }

  // The whole object. The default asks Head for the size, then Get; implementations that can do
  // it in one request override it. kCorrupt if the object changed size in between.
  virtual Result<std::string> GetObject(const std::string& key);

  // The size of `key`; kNotFound when absent.
  virtual Result<ObjectInfo> Head(const std::string& key) = 0;

  // Removes `key`; an absent key is OK.
  virtual Status Delete(const std::string& key) = 0;

  // Calls fn for every object whose key starts with `prefix` and sorts after `start_after` (empty:
  // from the first), in ascending byte order of their keys, until fn returns false. Objects put
  // or deleted during a listing may or may not be reported.
  virtual Status List(const std::string& prefix, const std::string& start_after,
                      const std::function<bool(const ObjectInfo&)>& fn) = 0;

  // Where the objects live, for logs and `ckptfs status` ("file:///data/ckpt", "s3://b/p").
  // Never contains credentials.
  virtual std::string Describe() const = 0;
  // Which objects these are, for telling backends apart (a remote tier's state belongs to one):
  // the same for every wrapper of one backend (an injector of faults). Describe() by default.
  virtual std::string Identity() const { return Describe(); }
};

// kInvalid (naming the rule broken) unless `key` follows the key rules above.
Status CheckKey(std::string_view key);

}  // namespace ckptfs
