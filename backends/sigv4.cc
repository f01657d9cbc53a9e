#include "backends/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstdint>
#include <map>

namespace ckptfs {
namespace {

constexpr char kHex[] = "0123456789abcdef";
constexpr char kHexUpper[] = "0123456789ABCDEF";
constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";

std::string ToHex(const unsigned char* p, size_t n) {
  std::string out(2 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

using Mac = std::string;  // 32 raw bytes

Mac Hmac(std::string_view key, std::string_view msg) { return HmacSha256(key, msg); }

bool IsUnreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// SigV4's Trimall: no leading or trailing whitespace, each inner run of it one space.
std::string TrimAll(std::string_view v) {
  std::string out;
  bool pending_space = false;
  for (char c : v) {
    bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
    if (space) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

// RFC 3986 dot-segment removal plus the collapse of empty segments that non-S3 services expect.
// A trailing '/' survives when something is left before it.
std::string NormalizePath(std::string_view path) {
  if (path.empty()) return "/";
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = std::min(path.find('/', start), path.size());
    std::string_view seg = path.substr(start, end - start);
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
    } else if (!seg.empty() && seg != ".") {
      out.push_back(seg);
    }
    start = end + 1;
  }
  std::string result = path.front() == '/' ? "/" : "";
  for (size_t i = 0; i < out.size(); ++i) {
    if (i) result += '/';
    result += out[i];
  }
  if (path.back() == '/' && !out.empty()) result += '/';
  return result;
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHexUpper[c >> 4]);
      out.push_back(kHexUpper[c & 15]);
    }
  }
  return out;
}

std::string UriDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string CanonicalQuery(const HeaderList& query) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (const auto& [name, value] : query) {
    enc.emplace_back(UriEncode(name, false), UriEncode(value, false));
  }
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [name, value] : enc) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

std::string HmacSha256(std::string_view key, std::string_view msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string Sha256Hex(const void* data, size_t len) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data, len, md, &n, EVP_sha256(), nullptr);
  return ToHex(md, n);
}

std::string AmzDate(std::time_t t) {
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

SigV4Signer::SigV4Signer(AwsCredentials credentials, std::string region, std::string service,
                         Flavor flavor)
    : credentials_(std::move(credentials)),
      region_(std::move(region)),
      service_(std::move(service)),
      flavor_(flavor) {}

SigV4Signature SigV4Signer::Sign(const SigV4Request& req, std::time_t now) const {
  SigV4Signature sig;
  const std::string amz_date = AmzDate(now);
  const std::string day = amz_date.substr(0, 8);

  sig.headers.emplace_back("host", req.host);
  sig.headers.emplace_back("x-amz-date", amz_date);
  if (flavor_ == Flavor::kS3) sig.headers.emplace_back("x-amz-content-sha256", req.payload_sha256);
  if (!credentials_.session_token.empty()) {
    sig.headers.emplace_back("x-amz-security-token", credentials_.session_token);
  }

  // Canonical headers: lower-case names in byte order; a repeated name's values joined by ','
  // in the order given. The headers added above replace any the caller passed by those names.
  std::map<std::string, std::vector<std::string>> canon;
  for (const auto& [name, value] : req.headers) {
    std::string lname = Lower(name);
    bool ours = std::any_of(sig.headers.begin(), sig.headers.end(),
                            [&](const auto& h) { return h.first == lname; });
    if (!ours) canon[lname].push_back(TrimAll(value));
  }
  for (const auto& [name, value] : sig.headers) canon[name] = {TrimAll(value)};

  std::string canonical_headers, signed_headers;
  for (const auto& [name, values] : canon) {
    canonical_headers += name;
    canonical_headers += ':';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i) canonical_headers += ',';
      canonical_headers += values[i];
    }
    canonical_headers += '\n';
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += name;
  }

  std::string path = EncodePath(req.path.empty() ? "/" : req.path);
  if (flavor_ == Flavor::kGeneric) path = UriEncode(NormalizePath(path), true);

  sig.canonical_request = req.method + '\n' + path + '\n' + CanonicalQuery(req.query) + '\n' +
                          canonical_headers + '\n' + signed_headers + '\n' + req.payload_sha256;

  const std::string scope = day + '/' + region_ + '/' + service_ + "/aws4_request";
  sig.string_to_sign = std::string(kAlgorithm) + '\n' + amz_date + '\n' + scope + '\n' +
                       Sha256Hex(sig.canonical_request.data(), sig.canonical_request.size());

  Mac key = Hmac("AWS4" + credentials_.secret_access_key, day);
  key = Hmac(key, region_);
  key = Hmac(key, service_);
  key = Hmac(key, "aws4_request");
  Mac mac = Hmac(key, sig.string_to_sign);
  std::string signature = ToHex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size());

  sig.authorization = std::string(kAlgorithm) + " Credential=" + credentials_.access_key_id + '/' +
                      scope + ", SignedHeaders=" + signed_headers + ", Signature=" + signature;
  sig.headers.emplace_back("authorization", sig.authorization);
  return sig;
}

}  // namespace ckptfs
