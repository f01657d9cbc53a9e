// S3Backend: the remote tier on any S3-compatible object store (AWS S3, Ceph RGW, MinIO, ...),
// over libcurl with SigV4 (backends/sigv4.h). Objects live in one bucket under a key prefix.
//
// Every Backend call may run concurrently from many threads; up to max_connections requests are
// in flight at once and reuse their connections. Transient failures (connection errors,
// timeouts, 5xx, 429 and throttling codes) are retried with exponential backoff and full jitter;
// other 4xx answers are not. Objects above multipart_part_bytes are uploaded in parts, in
// parallel. ObjectInfo::version is the object's ETag.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "backends/sigv4.h"
#include "common/status.h"

namespace ckptfs {

struct S3Options {
  // "http(s)://host[:port]". Empty: $AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com.
  // (The CLI's --s3-endpoint lands here.) No user:password part, no path.
  std::string endpoint;
  std::string bucket;
  // Keys live under this prefix ("ckpt/run7" stores "chunks/ab" as "ckpt/run7/chunks/ab").
  // Follows the key rules of backend.h; empty: the bucket's root.
  std::string prefix;
  // Empty: $AWS_REGION, $AWS_DEFAULT_REGION, the profile's region, else "us-east-1".
  std::string region;
  // The credentials profile (~/.aws/credentials). Empty: $AWS_PROFILE, else "default"; an
  // explicit profile ignores the AWS_* key variables.
  std::string profile;
  // Empty: from the environment or the profile (backends/credentials.h).
  AwsCredentials credentials;

  // kAuto: path-style (http://host/bucket/key) for an IP address or localhost endpoint and for
  // bucket names with dots (they break TLS wildcard certificates); virtual-hosted
  // (http://bucket.host/key) otherwise.
  enum class Addressing { kAuto, kPath, kVirtual };
  Addressing addressing = Addressing::kAuto;

  // Requests in flight at once (each with its own kept-alive connection), 1..1024.
  uint32_t max_connections = 16;
  // Tries per request (1: no retry), and the backoff: the n-th retry waits a random time in
  // [0, min(retry_max_ms, retry_base_ms * 2^(n-1))).
  uint32_t max_attempts = 6;
  uint32_t retry_base_ms = 100;
  uint32_t retry_max_ms = 5000;
  uint32_t connect_timeout_ms = 5000;
  // A transfer that moves under 1 KiB/s for this long is abandoned and retried.
  uint32_t stall_timeout_s = 30;
  // Objects larger than this are uploaded as a multipart upload in parts of this size (raised
  // for an object that would need more than 10000 parts). 5 MiB (S3's smallest part) .. 5 GiB.
  uint64_t multipart_part_bytes = 16ull << 20;
  // Parts of one multipart upload sent at once (bounded by max_connections).
  uint32_t multipart_parallel = 4;
  // Keys asked for per ListObjectsV2 request, 1..1000 (S3's maximum, and the best choice; smaller
  // only to exercise continuation tokens).
  uint32_t list_page_keys = 1000;
  bool verify_tls = true;
  std::string ca_file;  // empty: the system's CA bundle

  // Fills the empty fields from the environment and the AWS files, normalizes the prefix and
  // checks every field; kInvalid (or kPermission when no credentials are found) on the first
  // problem. OpenS3Backend calls it.
  Status Resolve();
};

// "s3://BUCKET[/PREFIX]" -> bucket and prefix set in `options`; kInvalid for anything else.
Status ParseS3Url(const std::string& url, S3Options* options);

// Resolves `options`, then checks that the bucket answers (a one-key listing under the prefix).
// kNotFound when the bucket does not exist, kPermission when the credentials are refused, kIo
// when the endpoint cannot be reached (after the retries), each with a message saying which.
Result<std::unique_ptr<Backend>> OpenS3Backend(const S3Options& options);

class S3Client;

class S3Backend : public Backend {
 public:
  ~S3Backend() override;

  Status Put(const std::string& key, const void* data, size_t len) override;
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override;
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override;
  Result<size_t> GetExact(const std::string& key, void* buf, size_t len) override;
  Result<std::string> GetObject(const std::string& key) override;
  Result<ObjectInfo> Head(const std::string& key) override;
  Status Delete(const std::string& key) override;
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override;
  std::string Describe() const override;

  // Requests sent (each try counts) and tries that were retries, since open.
  uint64_t requests() const;
  uint64_t retries() const;

 private:
  friend Result<std::unique_ptr<Backend>> OpenS3Backend(const S3Options& options);
  S3Backend(S3Options options, std::unique_ptr<S3Client> client, std::string describe);

  std::string FullKey(const std::string& key) const { return options_.prefix + key; }
  Status PutMultipart(const std::string& key, const char* data, size_t len);
  Status CheckBucket();

  S3Options options_;  // credentials cleared
  std::unique_ptr<S3Client> client_;
  std::string describe_;
};

}  // namespace ckptfs
