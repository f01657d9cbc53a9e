#include "peers/peer_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

#include "peers/peer_protocol.h"

namespace ckptfs {
namespace {

// How long a connection may take to send its request, and the receiver to take each part of
// the answer.
constexpr double kIoTimeoutS = 10;

}  // namespace

Result<std::unique_ptr<PeerServer>> PeerServer::Start(const std::string& address, std::string key,
                                                      uint64_t max_len, Serve serve,
                                                      bool any_port, int threads,
                                                      PeerMetrics* metrics) {
  ASSIGN_OR_RETURN(Socket s, ListenTcp(address, any_port));
  std::unique_ptr<PeerServer> server(
      new PeerServer(std::move(s), std::move(key), max_len, std::move(serve), metrics));
  const char* faults = std::getenv("CKPTFS_PEER_FAULTS");
  if (faults && std::strcmp(faults, "corrupt") == 0) {
    server->corrupt_ = true;
    server->log_->warn("test fault: every chunk this node serves to a peer is corrupted");
  }
  for (int i = 0; i < threads; ++i) server->threads_.emplace_back([p = server.get()] { p->Run(); });
  return server;
}

PeerServer::PeerServer(Socket listen, std::string key, uint64_t max_len, Serve serve,
                       PeerMetrics* metrics)
    : listen_(std::move(listen)),
      key_(std::move(key)),
      max_len_(max_len),
      serve_(std::move(serve)),
      port_(BoundPort(listen_)),
      log_(GetLogger("peers")),
      own_metrics_(metrics ? nullptr : std::make_unique<PeerMetrics>()),
      metrics_(metrics ? metrics : own_metrics_.get()) {}

PeerServer::~PeerServer() { Stop(); }

void PeerServer::Stop() {
  if (stopping_.exchange(true)) return;
  ::shutdown(listen_.fd(), SHUT_RDWR);  // wakes every accept()
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void PeerServer::Run() {
  while (!stopping_.load()) {
    int fd = ::accept4(listen_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        log_->warn("peer endpoint: accept: {}", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      if (errno == EINVAL) return;  // shut down
      log_->error("peer endpoint: accept: {}", std::strerror(errno));
      return;
    }
    Handle(Socket(fd));
  }
}

void PeerServer::Refuse(Socket& conn, const std::string& from, PeerRefusal reason,
                        const std::string& why) {
  metrics_->refusal(reason).Add(1);
  log_->warn("peer {}: refused: {}", from, why);
  if (reason == PeerRefusal::kIncomplete) return;  // no one to answer
  const std::string head = EncodePeerAnswerHeader(PeerAnswer::kRefused, 0);
  (void)conn.SendAll(head.data(), head.size());
}

bool PeerServer::FreshNonce(const std::string& nonce, int64_t now) {
  MutexLock lock(&mu_);
  if (now - last_prune_ > kMaxSkewS) {  // forget what no valid request can repeat any more
    for (auto it = nonces_.begin(); it != nonces_.end();) {
      it = now - it->second > 2 * kMaxSkewS ? nonces_.erase(it) : std::next(it);
    }
    last_prune_ = now;
  }
  return nonces_.emplace(nonce, now).second;
}

void PeerServer::Handle(Socket conn) {
  const std::string from = PeerName(conn.fd());
  if (!conn.SetTimeout(kIoTimeoutS).ok()) return;
  char wire[PeerRequest::kWireSize];
  if (Status st = conn.RecvAll(wire, sizeof(wire)); !st.ok()) {
    return Refuse(conn, from, PeerRefusal::kIncomplete, "no whole request (" + st.message() + ")");
  }
  const std::time_t now = std::time(nullptr);
  auto req = DecodePeerRequest(std::string_view(wire, sizeof(wire)), key_, now);
  if (!req.ok()) return Refuse(conn, from, PeerRefusal::kProof, req.status().message());
  if (!FreshNonce(req->nonce, now)) {
    return Refuse(conn, from, PeerRefusal::kReplay, "a replayed request");
  }
  if (req->len == 0 || req->len > max_len_) {
    return Refuse(conn, from, PeerRefusal::kLength,
                  "a chunk length of " + std::to_string(req->len) + " bytes");
  }
  auto chunk = serve_(req->id, req->len);
  if (!chunk.ok()) {
    const bool absent = chunk.status().code() == Code::kNotFound;
    metrics_->unserved_by(absent ? PeerUnserved::kNotHere : PeerUnserved::kFailed).Add(1);
    if (!absent) {
      log_->warn("peer {}: chunk {}: {}", from, req->id.Hex(), chunk.status().ToString());
    }
    const std::string head =
        EncodePeerAnswerHeader(absent ? PeerAnswer::kNotHere : PeerAnswer::kFailed, 0);
    (void)conn.SendAll(head.data(), head.size());
    return;
  }
  const std::string head = EncodePeerAnswerHeader(PeerAnswer::kOk, req->len);
  Status st = conn.SendAll(head.data(), head.size());
  if (st.ok() && corrupt_) {
    std::string bad(static_cast<const char*>(chunk->bytes), req->len);
    bad[0] = static_cast<char>(bad[0] ^ 0x5a);
    st = conn.SendAll(bad.data(), bad.size());
  } else if (st.ok()) {
    st = conn.SendAll(chunk->bytes, req->len);
  }
  if (!st.ok()) {
    log_->debug("peer {}: chunk {}: {}", from, req->id.Hex(), st.message());
    return;
  }
  metrics_->served_chunks.Add(1);
  metrics_->served_bytes.Add(req->len);
}

}  // namespace ckptfs
