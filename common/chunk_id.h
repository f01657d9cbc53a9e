// ChunkId: the XXH3-128 of a chunk's bytes, its only name. A vocabulary type shared by every tier
// (cache, store, later the backends), so it lives below all of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace ckptfs {

struct ChunkId {
  uint64_t hi = 0;
  uint64_t lo = 0;

  static ChunkId Of(const void* data, size_t len);
  // 32 lowercase hex digits, hi first.
  std::string Hex() const;
  static std::optional<ChunkId> FromHex(std::string_view hex);
  // 16 bytes, big-endian hi then lo: the LMDB key, so keys sort like Hex().
  void ToBytes(uint8_t out[16]) const;
  static ChunkId FromBytes(const uint8_t in[16]);

  // The all-zero id never names a chunk: manifests use it for holes.
  bool IsZero() const { return hi == 0 && lo == 0; }
  friend bool operator==(const ChunkId&, const ChunkId&) = default;
  friend auto operator<=>(const ChunkId&, const ChunkId&) = default;
};

struct ChunkIdHash {
  size_t operator()(const ChunkId& id) const { return static_cast<size_t>(id.lo ^ (id.hi * 31)); }
};

}  // namespace ckptfs
