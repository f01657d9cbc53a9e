// The byte encodings MetaStore's tables share: big-endian integers (LMDB's byte order is then
// numeric order) and inode-number keys. Internal to store/meta_store*.cc.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace ckptfs::meta_codec
