// The byte encodings MetaStore's tables share: big-endian integers (LMDB's byte order is then
// numeric order) and inode-number keys. Internal to store/meta_store*.cc.
#pragma once

#include <lmdb.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ckptfs::meta_codec {

inline void PutU64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

inline std::string InoKey(uint64_t ino) {
  std::string k;
  PutU64(k, ino);
  return k;
}

// A per-tier name: tier 0 keeps the name it had before the chain (older stores read on).
inline std::string TierKey(std::string_view base, int tier) {
  return tier == 0 ? std::string(base) : std::string(base) + "." + std::to_string(tier);
}

inline Status LmdbError(int rc, const std::string& what) {
  Code code = Code::kIo;
  if (rc == MDB_MAP_FULL) code = Code::kNoSpace;
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID) code = Code::kCorrupt;
  if (rc == ENOSPC) code = Code::kNoSpace;
  return Status(code, what + ": " + mdb_strerror(rc));
}

}  // namespace ckptfs::meta_codec
