#include "common/chunk_id.h"

#include <xxhash.h>

namespace ckptfs {

ChunkId ChunkId::Of(const void* data, size_t len) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  return ChunkId{h.high64, h.low64};
}

std::string ChunkId::Hex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[i] = kDigits[(hi >> (60 - 4 * i)) & 0xf];
    s[16 + i] = kDigits[(lo >> (60 - 4 * i)) & 0xf];
  }
  return s;
}

std::optional<ChunkId> ChunkId::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  ChunkId id;
  for (int i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    uint64_t& half = i < 16 ? id.hi : id.lo;
    half = (half << 4) | d;
  }
  return id;
}

void ChunkId::ToBytes(uint8_t out[16]) const {
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<uint8_t>(hi >> (56 - 8 * i));
    out[8 + i] = static_cast<uint8_t>(lo >> (56 - 8 * i));
  }
}

ChunkId ChunkId::FromBytes(const uint8_t in[16]) {
  ChunkId id;
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | in[i];
    id.lo = (id.lo << 8) | in[8 + i];
  }
  return id;
}

}  // namespace ckptfs
