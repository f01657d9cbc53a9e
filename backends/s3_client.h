// One bucket's requests: addressing (path-style or virtual-hosted), SigV4 signing, retries with
// exponential backoff and full jitter, and the mapping of S3 errors to Status. S3Backend builds
// the operations on top of it.
//
// Thread-safe; immutable after Create except for its counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/http.h"
#include "backends/sigv4.h"
#include "common/log.h"
#include "common/status.h"

namespace ckptfs {

struct S3Call {
  std::string method;
  std::string key;  // the full object key, prefix included; empty: the bucket itself
  HeaderList query;
  HeaderList headers;  // signed along with the ones SigV4 adds
  const void* body = nullptr;
  size_t body_len = 0;
  std::string payload_sha256;  // empty: computed here from the body
  BodySink* sink = nullptr;    // 2xx bodies; Reset before each retry
  std::string what;            // names the request in messages; empty: "METHOD key"
};

struct S3ClientConfig {
  std::string scheme;  // "http" or "https"
  std::string host;    // lower-case name or IP ("[::1]" for IPv6)
  int port = 0;        // 0: the scheme's default
  std::string bucket;
  bool path_style = true;
  std::string region;
  AwsCredentials credentials;
  uint32_t max_attempts = 6;
  uint32_t retry_base_ms = 100;
  uint32_t retry_max_ms = 5000;
  HttpClient::Options http;
  std::string describe;  // "s3://bucket/prefix", for messages
};

class S3Client {
 public:
  static Result<std::unique_ptr<S3Client>> Create(S3ClientConfig config);

  // Sends `call`, retrying transport failures, 5xx, 429 and throttling or timeout error codes.
  // OK with `resp` filled when the server gave an answer that another try would not change
  // (2xx, and 4xx that the caller judges, usually with Error()); kIo when the tries ran out;
  // kCorrupt when the sink refused the body.
  Status Send(const S3Call& call, HttpResponse* resp);

  // The Status for a non-2xx answer: its code from the HTTP status and S3's error Code, its
  // message naming the request, the status, the Code and S3's Message (never credentials).
  Status Error(const S3Call& call, const HttpResponse& resp) const;

  const S3ClientConfig& config() const { return config_; }
  uint64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  uint64_t retries() const { return retries_.load(std::memory_order_relaxed); }

 private:
  S3Client(S3ClientConfig config, std::unique_ptr<HttpClient> http);
  std::string What(const S3Call& call) const;

  S3ClientConfig config_;
  SigV4Signer signer_;
  std::string host_header_;  // what is signed and sent as Host
  std::string base_url_;     // scheme://host[:port]
  std::unique_ptr<HttpClient> http_;
  Logger log_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
};

// The S3 error Code and Message of an error document ("" when the body is not one).
struct S3ErrorInfo {
  std::string code;
  std::string message;
};
S3ErrorInfo ParseS3Error(const std::string& body);

}  // namespace ckptfs
