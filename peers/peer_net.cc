#include "peers/peer_net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "peers/peer_protocol.h"

namespace ckptfs {
namespace {

// The messages of timeouts (IsTimeout knows them).
constexpr const char* kSendTimedOut = "send timed out";
constexpr const char* kTimedOut = "timed out";
constexpr const char* kConnectTimedOut = "connect timed out";

}  // namespace

bool IsTimeout(const Status& st) {
  return st.code() == Code::kIo &&
         (st.message() == kSendTimedOut || st.message() == kTimedOut ||
          st.message() == kConnectTimedOut);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Status Socket::SetTimeout(double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return Status::FromErrno(errno, "socket timeout");
  }
  return Status::Ok();
}

Status Socket::SendAll(const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return IoError(errno == EAGAIN ? std::string(kSendTimedOut) : std::strerror(errno));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status Socket::RecvAll(void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd_, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return IoError(errno == EAGAIN ? std::string(kTimedOut) : std::strerror(errno));
    }
    if (n == 0) return IoError("connection closed");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<Socket> ConnectTcp(const std::string& addr, double timeout_s) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(SplitHostPort(addr, "peer", &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || !res) {
    return IoError("resolve " + host + ": " + ::gai_strerror(rc));
  }
  sockaddr_in sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  sa.sin_port = htons(port);
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return Status::FromErrno(errno, "socket");
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno != EINPROGRESS) return IoError(std::string("connect: ") + std::strerror(errno));
    pollfd pfd{s.fd(), POLLOUT, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(timeout_s * 1000));
    if (rc == 0) return IoError(kConnectTimedOut);
    int err = 0;
    socklen_t n = sizeof(err);
    if (rc < 0 || ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &n) != 0) err = errno;
    if (err != 0) return IoError(std::string("connect: ") + std::strerror(err));
  }
  const int flags = ::fcntl(s.fd(), F_GETFL);
  if (flags < 0 || ::fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return Status::FromErrno(errno, "fcntl");
  }
  const int one = 1;
  (void)::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  RETURN_IF_ERROR(s.SetTimeout(timeout_s));
  return s;
}

Result<Socket> ListenTcp(const std::string& addr, bool any_port) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(SplitHostPort(addr, "peer_listen", &host, &port, any_port));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return Invalid("peer_listen '" + addr + "': the host must be an IPv4 address (the fabric's)");
  }
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Status::FromErrno(errno, "socket");
  const int one = 1;
  (void)::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return Status::FromErrno(errno, "peer_listen: bind " + addr);
  }
  if (::listen(s.fd(), 128) != 0) return Status::FromErrno(errno, "peer_listen: listen " + addr);
  return s;
}

uint16_t BoundPort(const Socket& s) {
  sockaddr_in sa{};
  socklen_t n = sizeof(sa);
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&sa), &n) != 0) return 0;
  return ntohs(sa.sin_port);
}

std::string PeerName(int fd) {
  sockaddr_in sa{};
  socklen_t n = sizeof(sa);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &n) != 0) return "?";
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace ckptfs
