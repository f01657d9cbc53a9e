// PeerBackend: the object store, with chunks served node to node in front of it.
//
// The nodes are this one, the peers given, and with `discover` those whose records in the
// bucket are fresh (PeerDirectory); every node that counts the same set picks the same owners.
//
// Wraps the farthest tier (the bucket every node mounts). A whole-chunk read (GetExact of
// "chunks/<2 hex>/<id>") goes to the chunk's owner, chosen by rendezvous hashing of the chunk
// id over this node and its peers (peers/peer_protocol.h); the owner fetches it from the store
// once and serves every other node. When this node is the owner, or the owner is marked down,
// the read goes to the store. A peer that refuses, fails, times out or answers bytes that are
// not the chunk's (verified here against the id, before the bytes leave this class) is logged by
// its address, marked down for a while, and the read goes to the store: a read never ends with
// a peer's wrong bytes, and never fails for a peer's fault. Every other call goes to the store.
//
// Unlike other backends this one verifies what it reads: its peers are not the bucket.
// Counts what its reads got from peers, and why they fell back to the store, in PeerMetrics.
// Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "peers/peer_directory.h"
#include "peers/peer_protocol.h"

namespace ckptfs {

struct PeerOptions {
  // This node's peer address as its peers name it ("10.0.0.5:7070"); empty: it serves none and
  // owns no chunk.
  std::string self;
  // The other nodes' addresses (an entry equal to `self` is dropped, and repeats).
  std::vector<std::string> peers;
  // The bucket's peer key (DerivePeerKey).
  std::string key;
  // How long a peer may take to connect and then between bytes of its answer.
  double timeout_s = 10;
  // How long a peer that failed is left out.
  double down_s = 30;
  // Whether peers are also found through the bucket (peers/peer_directory.h), and how often
  // this node's record is put anew and the others' listed.
  bool discover = false;
  double heartbeat_s = 10;
};

class PeerBackend : public Backend {
 public:
  // With `discover`, puts this node's record and lists the others' before it returns. Counts into
  // `metrics` (one of its own when null), which must outlive it.
  PeerBackend(std::unique_ptr<Backend> store, PeerOptions options,
              PeerMetrics* metrics = nullptr);
  ~PeerBackend() override;

  // Whether this node owns chunk `id` among the nodes it counts (the server fetches only those
  // it owns from the store).
  bool OwnedHere(const ChunkId& id);
  const PeerOptions& options() const { return options_; }
  PeerMetrics& metrics() { return *metrics_; }

  Result<size_t> GetExact(const std::string& key, void* buf, size_t len) override;

  Status Put(const std::string& key, const void* data, size_t len) override {
    return store_->Put(key, data, len);
  }
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override {
    return store_->PutIfAbsent(key, data, len);
  }
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override {
    return store_->Get(key, offset, buf, len);
  }
  Result<std::string> GetObject(const std::string& key) override {
    return store_->GetObject(key);
  }
  Result<ObjectInfo> Head(const std::string& key) override { return store_->Head(key); }
  Status Delete(const std::string& key) override { return store_->Delete(key); }
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override {
    return store_->List(prefix, start_after, fn);
  }
  std::string Describe() const override { return store_->Describe(); }
  std::string Identity() const override { return store_->Identity(); }

 private:
  using Clock = std::chrono::steady_clock;
  using Nodes = std::shared_ptr<const RendezvousSet>;
  Nodes nodes();
  void SetDiscovered(const std::vector<std::string>& live);
  void SetNodes(Nodes nodes);
  // The owner's address; empty when this node owns it or the owner is down (then *down is set).
  std::string PeerFor(const ChunkId& id, bool* down);
  // Chunk `id` from `peer`, counted: the fallback's reason when it failed.
  Status AskPeer(const std::string& peer, const ChunkId& id, void* buf, size_t len);
  // Chunk `id` from `peer` into buf (len bytes), verified. kNotFound: the peer does not have it.
  Status FetchFromPeer(const std::string& peer, const ChunkId& id, void* buf, size_t len);
  void MarkDown(const std::string& peer, const std::string& why);
  void CountDown() REQUIRES(mu_);

  std::unique_ptr<Backend> store_;
  PeerOptions options_;
  std::vector<std::string> given_;  // self (when set) and the peers given
  Logger log_;
  std::unique_ptr<PeerMetrics> own_metrics_;  // when none was given
  PeerMetrics* const metrics_;
  Mutex mu_;
  Nodes nodes_ GUARDED_BY(mu_);  // given_ and the peers discovered: the rendezvous set
  std::unordered_map<std::string, Clock::time_point> down_until_ GUARDED_BY(mu_);
  std::unique_ptr<PeerDirectory> directory_;  // with `discover`
};

// The peer key of the bucket `url` names ("s3://BUCKET[/PREFIX]"), derived from the secret key
// of the credentials its S3 backend uses (`endpoint` as BackendSpec's). kInvalid for a tier that
// is not S3: nodes prove themselves with the bucket's credentials.
Result<std::string> PeerKeyOf(const std::string& url, const std::string& endpoint);

// The chunk named by a chunk object's key ("chunks/<2 hex>/<32 hex>"); nullopt for other keys.
std::optional<ChunkId> ChunkOfKey(const std::string& key);

}  // namespace ckptfs
