// A small HTTP/1.1 client on libcurl for the S3 backend: a pool of reusable easy handles (each
// keeps its connection alive between requests), DNS and TLS sessions shared among them, and
// response bodies delivered straight from libcurl's buffer to the caller's sink.
//
// Thread-safe: Perform may run from any number of threads; at most max_connections requests are
// in flight at once, and the others wait for a handle.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backends/sigv4.h"
#include "common/status.h"

namespace ckptfs {

struct HttpResponse {
  long status = 0;          // 0 until a status line arrived
  HeaderList headers;       // names lower-cased, in arrival order (the last response's only)
  std::string body;         // the body of a non-2xx answer, or of a 2xx one when there is no sink
  uint64_t body_bytes = 0;  // bytes of the body received (sink or not)

  // The value of the header `lname` (lower case), or nullptr.
  const std::string* Header(std::string_view lname) const;
};

// Receives a 2xx response body, piece by piece, straight from libcurl's receive buffer.
class BodySink {
 public:
  virtual ~BodySink() = default;
  // `head` holds the status and headers. Returning false aborts the transfer (Perform then
  // reports kCorrupt with the reason from Why()).
  virtual bool Write(const HttpResponse& head, const char* data, size_t n) = 0;
  virtual std::string Why() const { return "the response body was refused"; }
  // Called before each try of a request that is retried: forget what earlier tries delivered.
  virtual void Reset() {}
};

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  HeaderList headers;
  const void* body = nullptr;  // PUT/POST body, not copied; must outlive Perform
  size_t body_len = 0;
  BodySink* sink = nullptr;  // for 2xx bodies; nullptr: into HttpResponse::body
};

class HttpClient {
 public:
  struct Options {
    uint32_t max_connections = 16;
    uint32_t connect_timeout_ms = 5000;
    // A transfer slower than 1 KiB/s for this long is abandoned (a stalled server), instead of a
    // total timeout that a large object on a slow link would hit.
    uint32_t stall_timeout_s = 30;
    bool verify_tls = true;
    std::string ca_file;  // empty: the system's CA bundle
  };

  // Fails when libcurl cannot be initialized.
  static Result<std::unique_ptr<HttpClient>> Create(const Options& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs one request; no retries here. OK when a complete response arrived, whatever its
  // status. kIo for transport failures (`retryable` says whether trying again may help:
  // refused or reset connections, timeouts, a truncated body); kCorrupt when the sink refused the
  // body; kInvalid for a bad URL or method.
  Status Perform(const HttpRequest& req, HttpResponse* resp, bool* retryable);

 private:
  struct Shared;
  explicit HttpClient(const Options& options);
  void* Acquire();
  void Release(void* handle);

  Options options_;
  std::unique_ptr<Shared> shared_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> idle_;  // guarded by mu_: CURL easy handles not in use
  uint32_t live_ = 0;        // guarded by mu_: handles created and not yet destroyed
};

}  // namespace ckptfs
