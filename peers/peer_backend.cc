#include "peers/peer_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <ctime>

#include "backends/s3_backend.h"
#include "peers/peer_net.h"
#include "peers/peer_protocol.h"

namespace ckptfs {

std::optional<ChunkId> ChunkOfKey(const std::string& key) {
  // chunks/ab/<32 hex>
  if (key.size() != 7 + 3 + 32 || key.compare(0, 7, "chunks/") != 0 || key[9] != '/') {
    return std::nullopt;
  }
  auto id = ChunkId::FromHex(std::string_view(key).substr(10));
  if (!id || id->Hex().compare(0, 2, key, 7, 2) != 0) return std::nullopt;
  return id;
}

Result<std::string> PeerKeyOf(const std::string& url, const std::string& endpoint) {
  if (url.rfind("s3://", 0) != 0) {
    return Invalid("peers need an s3:// farthest tier (they prove themselves with its "
                   "credentials), not " + url);
  }
  S3Options o;
  RETURN_IF_ERROR(ParseS3Url(url, &o));
  o.endpoint = endpoint;
  RETURN_IF_ERROR(o.Resolve());
  return DerivePeerKey(o.credentials.secret_access_key, o.bucket, o.prefix);
}

PeerBackend::PeerBackend(std::unique_ptr<Backend> store, PeerOptions options,
                         PeerMetrics* metrics)
    : store_(std::move(store)),
      options_(std::move(options)),
      log_(GetLogger("peers")),
      own_metrics_(metrics ? nullptr : std::make_unique<PeerMetrics>()),
      metrics_(metrics ? metrics : own_metrics_.get()) {
  if (!options_.self.empty()) given_.push_back(options_.self);
  for (const std::string& p : options_.peers) {
    if (std::find(given_.begin(), given_.end(), p) == given_.end()) given_.push_back(p);
  }
  SetNodes(std::make_shared<const RendezvousSet>(given_));
  if (options_.discover) {
    directory_ = std::make_unique<PeerDirectory>(
        store_.get(), options_.self, options_.heartbeat_s,
        [this](const std::vector<std::string>& live) { SetDiscovered(live); });
    directory_->Start();
  }
}

PeerBackend::~PeerBackend() {
  if (directory_) directory_->Stop();
}

void PeerBackend::SetDiscovered(const std::vector<std::string>& live) {
  std::vector<std::string> nodes = given_;
  for (const std::string& p : live) {
    if (std::find(nodes.begin(), nodes.end(), p) == nodes.end()) nodes.push_back(p);
  }
  SetNodes(std::make_shared<const RendezvousSet>(std::move(nodes)));
}

void PeerBackend::SetNodes(Nodes nodes) {
  const size_t others = nodes->size() - (options_.self.empty() ? 0 : 1);
  MutexLock lock(&mu_);
  nodes_ = std::move(nodes);
  metrics_->peers.store(static_cast<int64_t>(others), std::memory_order_relaxed);
}

void PeerBackend::CountDown() {
  metrics_->peers_down.store(static_cast<int64_t>(down_until_.size()),
                             std::memory_order_relaxed);
}

PeerBackend::Nodes PeerBackend::nodes() {
  MutexLock lock(&mu_);
  return nodes_;
}

bool PeerBackend::OwnedHere(const ChunkId& id) {
  if (options_.self.empty()) return false;
  const Nodes nodes = this->nodes();
  const int owner = nodes->Owner(id);
  return owner >= 0 && nodes->nodes()[static_cast<size_t>(owner)] == options_.self;
}

std::string PeerBackend::PeerFor(const ChunkId& id, bool* down) {
  const Nodes nodes = this->nodes();
  const int owner = nodes->Owner(id);
  if (owner < 0) return "";
  const std::string& peer = nodes->nodes()[static_cast<size_t>(owner)];
  if (peer == options_.self) return "";
  MutexLock lock(&mu_);
  auto d = down_until_.find(peer);
  if (d == down_until_.end()) return peer;
  if (Clock::now() < d->second) {  // down: the store serves its chunks meanwhile
    *down = true;
    return "";
  }
  down_until_.erase(d);
  CountDown();
  return peer;
}

void PeerBackend::MarkDown(const std::string& peer, const std::string& why) {
  {
    MutexLock lock(&mu_);
    down_until_[peer] = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(options_.down_s * 1000));
    CountDown();
  }
  log_->warn("peer {}: {}; its chunks come from the store for {} s", peer, why, options_.down_s);
}

Status PeerBackend::FetchFromPeer(const std::string& peer, const ChunkId& id, void* buf,
                                  size_t len) {
  ASSIGN_OR_RETURN(Socket s, ConnectTcp(peer, options_.timeout_s));
  const std::string req =
      EncodePeerRequest(MakePeerRequest(id, len, std::time(nullptr)), options_.key);
  RETURN_IF_ERROR(s.SendAll(req.data(), req.size()));
  char head[kPeerAnswerHeader];
  RETURN_IF_ERROR(s.RecvAll(head, sizeof(head)));
  PeerAnswer answer;
  uint64_t n = 0;
  RETURN_IF_ERROR(DecodePeerAnswerHeader(std::string_view(head, sizeof(head)), &answer, &n));
  switch (answer) {
    case PeerAnswer::kOk:
      break;
    case PeerAnswer::kNotHere:
      return NotFound("not on the peer");
    case PeerAnswer::kRefused:
      return Status(Code::kPermission, "the peer refused the request");
    case PeerAnswer::kFailed:
      return IoError("the peer could not read it");
  }
  if (n != len) return Corrupt("answered " + std::to_string(n) + " bytes for a chunk of " +
                               std::to_string(len));
  RETURN_IF_ERROR(s.RecvAll(buf, len));
  if (ChunkId::Of(buf, len) != id) return Corrupt("answered bytes that are not the chunk's");
  return Status::Ok();
}

Status PeerBackend::AskPeer(const std::string& peer, const ChunkId& id, void* buf, size_t len) {
  Status st;
  {
    const auto t0 = Clock::now();
    st = FetchFromPeer(peer, id, buf, len);
    const Outcome o = st.ok() ? Outcome::kOk
                      : st.code() == Code::kNotFound ? Outcome::kNotFound : Outcome::kError;
    metrics_->request(o).Observe(Clock::now() - t0);
  }
  if (st.ok()) {
    metrics_->fetched_chunks.Add(1);
    metrics_->fetched_bytes.Add(len);
    log_->debug("chunk {} ({} bytes) from peer {}", id.Hex(), len, peer);
    return st;
  }
  PeerFallback why = PeerFallback::kFailed;
  if (st.code() == Code::kNotFound) {
    why = PeerFallback::kNotHere;
    log_->debug("chunk {}: not on peer {}; from the store", id.Hex(), peer);
  } else {
    if (st.code() == Code::kCorrupt) {
      why = PeerFallback::kBadBytes;
      log_->error("chunk {} from peer {} failed verification ({}); fetching it from the store",
                  id.Hex(), peer, st.message());
    } else if (st.code() == Code::kPermission) {
      why = PeerFallback::kRefused;
    } else if (IsTimeout(st)) {
      why = PeerFallback::kSlow;
    }
    MarkDown(peer, "chunk " + id.Hex() + ": " + st.ToString());
  }
  metrics_->fallback(why).Add(1);
  return st;
}

Result<size_t> PeerBackend::GetExact(const std::string& key, void* buf, size_t len) {
  const auto id = ChunkOfKey(key);
  bool down = false;
  const std::string peer = id ? PeerFor(*id, &down) : "";
  if (!peer.empty()) {
    if (AskPeer(peer, *id, buf, len).ok()) return len;
  } else if (down) {
    metrics_->fallback(PeerFallback::kDown).Add(1);
  }
  return store_->GetExact(key, buf, len);
}

}  // namespace ckptfs
