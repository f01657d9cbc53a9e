// AWS Signature Version 4 (header form) on OpenSSL: canonical request, string to sign, signing key,
// Authorization header. Used by the S3 backend; checked request by request against botocore
// (tests/backends/sigv4_test.cc).
//
// Everything here is a pure function of its arguments; a SigV4Signer is immutable after
// construction and may be used from many threads at once.
#pragma once

#include <cstddef>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ckptfs {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Keys that sign requests. Never logged, never part of a Describe() or an error message.
struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term keys, no x-amz-security-token header

  bool empty() const { return access_key_id.empty() && secret_access_key.empty(); }
};

// One request to sign. Path, query names and values are raw (not yet percent-encoded): the
// signer encodes them, and the caller puts the same encoding on the wire (EncodePath and
// CanonicalQuery below), so that what was signed is what the server sees.
struct SigV4Request {
  std::string method;  // "GET", "PUT", ... (upper case)
  // The Host header: lower-case host name, ":port" only when not the scheme's default port.
  std::string host;
  std::string path = "/";  // starts with '/'; e.g. "/bucket/dir/a b+c"
  HeaderList query;        // name/value pairs; an empty value is signed as "name="
  HeaderList headers;      // further headers to sign (any case); repeated names are joined by ','
  // Lower-case hex SHA-256 of the body (Sha256Hex), or "UNSIGNED-PAYLOAD".
  std::string payload_sha256;
};

struct SigV4Signature {
  // The headers to send besides SigV4Request::headers, in this order: host, x-amz-date,
  // x-amz-content-sha256 (S3 only), x-amz-security-token (with a session token), authorization.
  HeaderList headers;
  std::string authorization;
  // Intermediate forms, for tests and debug logs (they hold no secret).
  std::string canonical_request;
  std::string string_to_sign;
};

class SigV4Signer {
 public:
  // kS3: the path is encoded once, as S3 wants, and x-amz-content-sha256 is sent and signed.
  // kGeneric: the path's dot segments and empty segments are removed and the encoded path encoded
  // again, as every other AWS service wants; no x-amz-content-sha256 header.
  enum class Flavor { kS3, kGeneric };

  SigV4Signer(AwsCredentials credentials, std::string region, std::string service,
              Flavor flavor = Flavor::kS3);

  // Signs `req` as made at `now` (seconds since the epoch, UTC).
  SigV4Signature Sign(const SigV4Request& req, std::time_t now) const;

  const std::string& region() const { return region_; }

 private:
  AwsCredentials credentials_;
  std::string region_;
  std::string service_;
  Flavor flavor_;
};

// Percent-encodes everything but the unreserved characters A-Z a-z 0-9 - _ . ~ (and '/' when
// keep_slash), with upper-case hex digits, byte by byte (UTF-8 stays UTF-8).
std::string UriEncode(std::string_view s, bool keep_slash);
// A raw path as sent on the wire and signed for S3: each '/'-separated segment encoded once.
inline std::string EncodePath(std::string_view raw_path) { return UriEncode(raw_path, true); }
// "a=1&b=&c=x%20y": names and values encoded, sorted by encoded name then value. Also a valid
// query string to send.
std::string CanonicalQuery(const HeaderList& query);
// Reverses UriEncode (and form encoding's '+' for space when plus_is_space). Malformed escapes
// are kept as they are.
std::string UriDecode(std::string_view s, bool plus_is_space);

// HMAC-SHA256 of `msg` keyed by `key`: 32 raw bytes.
std::string HmacSha256(std::string_view key, std::string_view msg);
// Lower-case hex SHA-256 of data[0..len).
std::string Sha256Hex(const void* data, size_t len);
// "20130524T000000Z".
std::string AmzDate(std::time_t t);

}  // namespace ckptfs
