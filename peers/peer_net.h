// Blocking TCP with timeouts, for the chunk protocol (peers/peer_protocol.h). IPv4.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace ckptfs {

// An open socket, closed when it goes.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Every send and receive from now on fails with kIo after `seconds` without progress.
  Status SetTimeout(double seconds);
  // All of data[0..len), or kIo.
  Status SendAll(const void* data, size_t len);
  // Exactly len bytes into buf, or kIo (the peer closed first, a timeout, a reset).
  Status RecvAll(void* buf, size_t len);

 private:
  int fd_ = -1;
};

// A connection to "HOST:PORT" (a name is resolved, IPv4), within `timeout_s`; the socket's sends
// and receives time out after `timeout_s` too.
Result<Socket> ConnectTcp(const std::string& addr, double timeout_s);
// A socket listening on exactly "IPV4:PORT" (a numeric address: no name is resolved, no other
// address bound). Port 0 (with `any_port`, for tests) picks a free port (BoundPort tells which).
Result<Socket> ListenTcp(const std::string& addr, bool any_port = false);
uint16_t BoundPort(const Socket& s);
// "a.b.c.d:port" of the other end of a connected socket.
std::string PeerName(int fd);
// Whether `st` is a connect, send or receive of this file that timed out.
bool IsTimeout(const Status& st);

}  // namespace ckptfs
