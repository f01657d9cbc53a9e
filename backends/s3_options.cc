// S3Options: filling from the environment, validation, the s3:// URL form and the endpoint.
#include <cstdlib>

#include "backends/credentials.h"
#include "backends/s3_backend.h"
#include "backends/s3_options_internal.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMinPartBytes = 5ull << 20;  // S3's smallest part (all but the last)
constexpr uint64_t kMaxPartBytes = 5ull << 30;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

bool IsIpv4(const std::string& host) {
  int dots = 0, digits = 0;
  for (char c : host) {
    if (c == '.') {
      if (digits == 0) return false;
      ++dots;
      digits = 0;
    } else if (c >= '0' && c <= '9') {
      if (++digits > 3) return false;
    } else {
      return false;
    }
  }
  return dots == 3 && digits > 0;
}

Status CheckBucketName(const std::string& b) {
  if (b.empty()) return Invalid("no S3 bucket given");
  if (b.size() > 255) return Invalid("S3 bucket name longer than 255 characters");
  for (char c : b) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_';
    if (!ok) return Invalid("S3 bucket name '" + b + "' has a character other than [A-Za-z0-9._-]");
  }
  return Status::Ok();
}

}  // namespace

Result<S3Endpoint> ParseS3Endpoint(const std::string& url) {
  S3Endpoint ep;
  if (url.find('@') != std::string::npos) {
    // Not echoed: the part before '@' may be a password.
    return Invalid("the S3 endpoint URL must not carry a user name or password");
  }
  std::string rest;
  std::string lower = Lower(url);
  if (lower.rfind("http://", 0) == 0) {
    ep.scheme = "http";
    rest = url.substr(7);
  } else if (lower.rfind("https://", 0) == 0) {
    ep.scheme = "https";
    rest = url.substr(8);
  } else {
    return Invalid("S3 endpoint '" + url + "' is not an http:// or https:// URL");
  }
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos && rest.find_first_not_of('/', slash) != std::string::npos) {
    return Invalid("S3 endpoint '" + url + "' has a path; give only scheme://host[:port]");
  }
  std::string port;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) return Invalid("S3 endpoint '" + url + "': unclosed '['");
    ep.host = Lower(authority.substr(0, close + 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return Invalid("S3 endpoint '" + url + "': bad port");
      port = authority.substr(close + 2);
    }
  } else {
    size_t colon = authority.rfind(':');
    ep.host = Lower(authority.substr(0, colon));
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (ep.host.empty() || ep.host.find_first_of(" \t\r\n?#") != std::string::npos) {
    return Invalid("S3 endpoint '" + url + "' has no valid host");
  }
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::atoi(port.c_str()) < 1 || std::atoi(port.c_str()) > 65535) {
      return Invalid("S3 endpoint '" + url + "' has a bad port");
    }
    ep.port = std::atoi(port.c_str());
  }
  return ep;
}

bool UsePathStyle(const S3Options& o, const S3Endpoint& ep) {
  if (o.addressing == S3Options::Addressing::kPath) return true;
  if (o.addressing == S3Options::Addressing::kVirtual) return false;
  bool ip = IsIpv4(ep.host) || (!ep.host.empty() && ep.host[0] == '[');
  bool dns_bucket = o.bucket.find_first_of("._ABCDEFGHIJKLMNOPQRSTUVWXYZ") == std::string::npos;
  return ip || ep.host == "localhost" || !dns_bucket;
}

Status S3Options::Resolve() {
  RETURN_IF_ERROR(CheckBucketName(bucket));
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) {
    Status st = CheckKey(prefix);
    if (!st.ok()) return Invalid("S3 key prefix: " + st.message());
    prefix += '/';
  }
  if (region.empty()) region = LoadAwsRegion(profile);
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = "https://s3." + region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  auto ep = ParseS3Endpoint(endpoint);
  if (!ep.ok()) return ep.status();
  if (credentials.empty()) {
    ASSIGN_OR_RETURN(credentials, LoadAwsCredentials(profile));
  } else if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return Invalid("S3 credentials need both an access key id and a secret key");
  }
  if (max_connections < 1 || max_connections > 1024) {
    return Invalid("S3 max_connections must be in 1..1024");
  }
  if (max_attempts < 1 || max_attempts > 100) return Invalid("S3 max_attempts must be in 1..100");
  if (retry_base_ms > retry_max_ms) return Invalid("S3 retry_base_ms exceeds retry_max_ms");
  if (multipart_part_bytes < kMinPartBytes || multipart_part_bytes > kMaxPartBytes) {
    return Invalid("S3 multipart_part_bytes must be between 5 MiB and 5 GiB");
  }
  if (multipart_parallel < 1) return Invalid("S3 multipart_parallel must be at least 1");
  if (list_page_keys < 1 || list_page_keys > 1000) {
    return Invalid("S3 list_page_keys must be in 1..1000");
  }
  if (stall_timeout_s < 1) return Invalid("S3 stall_timeout_s must be at least 1");
  return Status::Ok();
}

Status ParseS3Url(const std::string& url, S3Options* options) {
  if (url.rfind("s3://", 0) != 0)
    return Invalid("'" + url + "' is not an s3://BUCKET[/PREFIX] URL");
  std::string rest = url.substr(5);
  size_t slash = rest.find('/');
  std::string bucket = rest.substr(0, slash);
  RETURN_IF_ERROR(CheckBucketName(bucket));
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) {
    Status st = CheckKey(prefix);
    if (!st.ok()) return Invalid("prefix of '" + url + "': " + st.message());
  }
  options->bucket = bucket;
  options->prefix = prefix;
  return Status::Ok();
}

}  // namespace ckptfs
