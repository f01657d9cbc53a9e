#include "peers/peer_protocol.h"

#include <openssl/crypto.h>
#include <sys/random.h>
#include <xxhash.h>

#include <cstring>

#include "backends/sigv4.h"

namespace ckptfs {
namespace {

constexpr std::string_view kRequestMagic = "CKPR";
constexpr std::string_view kAnswerMagic = "CKPA";
constexpr uint32_t kVersion = 1;
constexpr size_t kSignedSize = PeerRequest::kWireSize - PeerRequest::kMacSize;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  }
  return v;
}

}  // namespace

std::string EncodePeerRequest(const PeerRequest& r, std::string_view key) {
  std::string out;
  out.reserve(PeerRequest::kWireSize);
  out.append(kRequestMagic);
  PutLe(&out, kVersion, 4);
  uint8_t id[16];
  r.id.ToBytes(id);
  out.append(reinterpret_cast<const char*>(id), sizeof(id));
  PutLe(&out, r.len, 8);
  PutLe(&out, static_cast<uint64_t>(r.time), 8);
  std::string nonce = r.nonce;
  nonce.resize(PeerRequest::kNonceSize, '\0');
  out.append(nonce);
  out.append(HmacSha256(key, out));
  return out;
}

PeerRequest MakePeerRequest(const ChunkId& id, uint64_t len, std::time_t now) {
  PeerRequest r;
  r.id = id;
  r.len = len;
  r.time = now;
  r.nonce.resize(PeerRequest::kNonceSize);
  size_t got = 0;
  while (got < r.nonce.size()) {
    ssize_t n = ::getrandom(r.nonce.data() + got, r.nonce.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return r;
}

Result<PeerRequest> DecodePeerRequest(std::string_view wire, std::string_view key,
                                      std::time_t now) {
  if (wire.size() != PeerRequest::kWireSize || wire.substr(0, 4) != kRequestMagic) {
    return Status(Code::kPermission, "not a chunk request");
  }
  if (GetLe(wire, 4, 4) != kVersion) return Status(Code::kPermission, "unknown protocol version");
  const std::string want = HmacSha256(key, wire.substr(0, kSignedSize));
  if (CRYPTO_memcmp(want.data(), wire.data() + kSignedSize, PeerRequest::kMacSize) != 0) {
    return Status(Code::kPermission, "the request's proof does not match the bucket's peer key");
  }
  PeerRequest r;
  r.id = ChunkId::FromBytes(reinterpret_cast<const uint8_t*>(wire.data() + 8));
  r.len = GetLe(wire, 24, 8);
  r.time = static_cast<int64_t>(GetLe(wire, 32, 8));
  r.nonce = std::string(wire.substr(40, PeerRequest::kNonceSize));
  const int64_t skew = r.time - static_cast<int64_t>(now);
  if (skew > kMaxSkewS || skew < -kMaxSkewS) {
    return Status(Code::kPermission,
                  "the request's time is " + std::to_string(skew) + " s off this node's clock");
  }
  return r;
}

std::string EncodePeerAnswerHeader(PeerAnswer a, uint64_t len) {
  std::string out(kAnswerMagic);
  PutLe(&out, static_cast<uint32_t>(a), 4);
  PutLe(&out, len, 8);
  return out;
}

Status DecodePeerAnswerHeader(std::string_view wire, PeerAnswer* a, uint64_t* len) {
  if (wire.size() != kPeerAnswerHeader || wire.substr(0, 4) != kAnswerMagic) {
    return Corrupt("not a chunk answer");
  }
  const uint64_t status = GetLe(wire, 4, 4);
  if (status > static_cast<uint32_t>(PeerAnswer::kFailed)) return Corrupt("unknown answer status");
  *a = static_cast<PeerAnswer>(status);
  *len = GetLe(wire, 8, 8);
  return Status::Ok();
}

std::string DerivePeerKey(std::string_view secret_key, std::string_view bucket,
                          std::string_view prefix) {
  std::string what = "ckptfs peer key v1\n";
  what.append(bucket);
  what.push_back('\n');
  what.append(prefix);
  return HmacSha256(secret_key, what);
}

namespace {

// A bijective 64-bit finalizer (xor-shift-multiply rounds): every input bit reaches every
// output bit, so weights of one chunk at different seeds look independent.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

}  // namespace

RendezvousSet::RendezvousSet(std::vector<std::string> nodes) : nodes_(std::move(nodes)) {
  seeds_.reserve(nodes_.size());
  for (const std::string& n : nodes_) seeds_.push_back(XXH3_64bits(n.data(), n.size()));
}

int RendezvousSet::Owner(const ChunkId& id) const {
  const uint64_t key = Mix64(id.hi ^ Mix64(id.lo));
  int best = -1;
  uint64_t best_weight = 0;
  for (size_t i = 0; i < seeds_.size(); ++i) {
    // The chunk's weight at this node. Ties (two addresses with one seed: never seen) go to the
    // lower name, so that the choice stays independent of the order.
    const uint64_t w = Mix64(key ^ seeds_[i]);
    if (best < 0 || w > best_weight ||
        (w == best_weight && nodes_[i] < nodes_[static_cast<size_t>(best)])) {
      best = static_cast<int>(i);
      best_weight = w;
    }
  }
  return best;
}

int RendezvousOwner(const ChunkId& id, const std::vector<std::string>& nodes) {
  return RendezvousSet(nodes).Owner(id);
}

Status SplitHostPort(const std::string& addr, const std::string& what, std::string* host,
                     uint16_t* port, bool any_port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return Invalid(what + " '" + addr + "': expected HOST:PORT");
  }
  const std::string p = addr.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) {
    return Invalid(what + " '" + addr + "': the port must be a number");
  }
  const unsigned long n = std::stoul(p);
  if ((n < 1 && !any_port) || n > 65535) {
    return Invalid(what + " '" + addr + "': the port must be in 1..65535");
  }
  *host = addr.substr(0, colon);
  *port = static_cast<uint16_t>(n);
  return Status::Ok();
}

}  // namespace ckptfs
