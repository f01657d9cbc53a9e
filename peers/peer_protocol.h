// The node-to-node chunk protocol (-o peer_listen=, -o peers=): what a request and an answer
// look like on the wire, how a request proves that its sender holds the bucket's credentials,
// and which node owns a chunk.
//
// A request names one chunk (id and length) and nothing else; a node serves chunks by id only,
// never names or listings. Every request carries an HMAC-SHA256 over its bytes, keyed by a peer
// key derived from the bucket's S3 secret key (the secret itself never travels), with the time
// it was made and a random nonce: a node refuses a request whose proof is wrong, whose time is
// off by more than kMaxSkewS, or whose nonce it has seen. Answers carry no proof: the bytes are
// the chunk's, and every receiver verifies them against the chunk's id. Nothing is encrypted.
//
// Pure functions and plain data; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"

namespace ckptfs {

struct PeerRequest {
  static constexpr size_t kWireSize = 88;
  static constexpr size_t kMacSize = 32;
  static constexpr size_t kNonceSize = 16;
  ChunkId id;
  uint64_t len = 0;
  int64_t time = 0;  // seconds since the epoch, UTC, when made
  std::string nonce;  // kNonceSize random bytes
};

// A request's wire form: "CKPR", version 1, the id, the length, the time, the nonce and the
// HMAC-SHA256 of all of those under `key` (kWireSize bytes, little-endian integers).
std::string EncodePeerRequest(const PeerRequest& r, std::string_view key);
// A fresh request for chunk `id` of `len` bytes made at `now`, with a random nonce.
PeerRequest MakePeerRequest(const ChunkId& id, uint64_t len, std::time_t now);

// The most a request's time may differ from the receiver's clock.
constexpr int64_t kMaxSkewS = 60;
// Decodes and checks `wire` (kWireSize bytes) against `key` at time `now`: kPermission naming
// what is wrong (a bad magic or version, a proof that does not match, a time too far off), the
// request when it is good. Does not know about replays: the server keeps the nonces it saw.
Result<PeerRequest> DecodePeerRequest(std::string_view wire, std::string_view key,
                                      std::time_t now);

// An answer: "CKPA", a status, the length of what follows; then the chunk's bytes when kOk.
enum class PeerAnswer : uint32_t { kOk = 0, kNotHere = 1, kRefused = 2, kFailed = 3 };
constexpr size_t kPeerAnswerHeader = 16;
std::string EncodePeerAnswerHeader(PeerAnswer a, uint64_t len);
// kCorrupt when the header is not an answer's.
Status DecodePeerAnswerHeader(std::string_view wire, PeerAnswer* a, uint64_t* len);

// The peer key of the bucket: HMAC-SHA256 of "ckptfs peer key v1", the bucket and the prefix,
// keyed by the secret key. Every node holding the bucket's secret derives the same key; the
// key does not give the secret back.
std::string DerivePeerKey(std::string_view secret_key, std::string_view bucket,
                          std::string_view prefix);

// The nodes a chunk's owner is chosen among (their peer addresses, "HOST:PORT"), by rendezvous
// (highest random weight) hashing: every node computes the same owner from the same set, each
// node owns about 1/n of the chunks, and a node leaving moves only the chunks it owned.
//
// What depends only on a node, a 64-bit seed hashed from its address, is computed once when the
// set is made; choosing an owner then costs one 64-bit mix per node: the chunk's weight at a node
// is a strong mix of the id's 64 bits folded with the node's seed (the id is already a hash of
// the chunk's bytes). Nodes that count the same addresses agree on every owner, in any order.
// Immutable once made; thread-safe.
class RendezvousSet {
 public:
  RendezvousSet() = default;
  explicit RendezvousSet(std::vector<std::string> nodes);
  const std::vector<std::string>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size(); }
  // The index in nodes() of chunk `id`'s owner; -1 when the set is empty.
  int Owner(const ChunkId& id) const;

 private:
  std::vector<std::string> nodes_;
  std::vector<uint64_t> seeds_;  // one per node, hashed from its address
};

// The owner of chunk `id` among `nodes`, as RendezvousSet(nodes).Owner(id): for a set used once.
int RendezvousOwner(const ChunkId& id, const std::vector<std::string>& nodes);

// "HOST:PORT" split; kInvalid naming `what` when it is not of that form or the port is not in
// 1..65535 (0..65535 with `any_port`: a listener's "pick one").
Status SplitHostPort(const std::string& addr, const std::string& what, std::string* host,
                     uint16_t* port, bool any_port = false);

}  // namespace ckptfs
