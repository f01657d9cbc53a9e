#include "backends/s3_backend.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <limits>

#include "backends/s3_client.h"
#include "backends/s3_options_internal.h"
#include "backends/s3_xml.h"

namespace ckptfs {
namespace {

// Offsets at or past this are past the end of any object (S3's largest is 5 TiB), and a range
// end is clamped to it, so that offset + len never overflows.
constexpr uint64_t kNoObjectIsThisLarge = 1ull << 62;

// Parses a decimal uint64 that must be the whole of `s`.
bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// An ETag without its quotes: the version of ObjectInfo, the same from HEAD and from a listing.
std::string Unquote(const std::string& etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    return etag.substr(1, etag.size() - 2);
  }
  return etag;
}

// "bytes START-END/TOTAL" (TOTAL may be '*', then total = UINT64_MAX).
bool ParseContentRange(const std::string& v, uint64_t* start, uint64_t* end, uint64_t* total) {
  if (v.rfind("bytes ", 0) != 0) return false;
  size_t dash = v.find('-', 6), slash = v.find('/', 6);
  if (dash == std::string::npos || slash == std::string::npos || dash > slash) return false;
  if (!ParseU64(v.substr(6, dash - 6), start) ||
      !ParseU64(v.substr(dash + 1, slash - dash - 1), end) || *end < *start) {
    return false;
  }
  std::string t = v.substr(slash + 1);
  if (t == "*") {
    *total = std::numeric_limits<uint64_t>::max();
    return true;
  }
  return ParseU64(t, total) && *total > *end;
}

// A ranged GET's body, written straight into the caller's buffer. A 206 body must start at the
// offset asked for and fit the buffer; a 200 (a server that ignored Range) is the whole object,
// of which only [offset, offset + len) is kept.
class RangeSink : public BodySink {
 public:
  // REQUIRES: offset < kNoObjectIsThisLarge.
  RangeSink(char* buf, size_t len, uint64_t offset)
      : buf_(buf), len_(len), offset_(offset), end_(offset + std::min<uint64_t>(len, 1ull << 62)) {}

  void Reset() override {
    received_ = 0;
    kept_ = 0;
    why_.clear();
  }

  bool Write(const HttpResponse& head, const char* data, size_t n) override {
    uint64_t body_start = 0;
    if (head.status == 206) {
      const std::string* cr = head.Header("content-range");
      uint64_t start, end, total;
      if (!cr || !ParseContentRange(*cr, &start, &end, &total) || start != offset_) {
        why_ = "a partial answer whose Content-Range (" + (cr ? *cr : std::string("none")) +
               ") does not start at the offset asked for";
        return false;
      }
      body_start = offset_;
    }
    // The piece covers object bytes [from, from + n).
    uint64_t from = body_start + received_;
    received_ += n;
    if (head.status == 206 && received_ > len_) {
      why_ = "a body longer than the " + std::to_string(len_) + " bytes asked for";
      return false;
    }
    uint64_t lo = std::max(from, offset_), hi = std::min(from + n, end_);
    if (lo < hi) {
      std::memcpy(buf_ + (lo - offset_), data + (lo - from), hi - lo);
      kept_ = std::max<uint64_t>(kept_, hi - offset_);
    }
    return true;
  }

  std::string Why() const override { return why_; }
  uint64_t kept() const { return kept_; }

 private:
  char* buf_;
  size_t len_;
  uint64_t offset_;
  uint64_t end_;  // offset_ + len_, without overflow
  uint64_t received_ = 0;
  uint64_t kept_ = 0;
  std::string why_;
};

// A whole object's body, into a string sized once from Content-Length.
class StringSink : public BodySink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  void Reset() override { out_->clear(); }
  bool Write(const HttpResponse& head, const char* data, size_t n) override {
    if (out_->empty()) {
      uint64_t len;
      const std::string* cl = head.Header("content-length");
      if (cl && ParseU64(*cl, &len) && len < (1ull << 40)) out_->reserve(len);
    }
    out_->append(data, n);
    return true;
  }

 private:
  std::string* out_;
};

}  // namespace

S3Backend::S3Backend(S3Options options, std::unique_ptr<S3Client> client, std::string describe)
    : options_(std::move(options)), client_(std::move(client)), describe_(std::move(describe)) {
  options_.credentials = AwsCredentials{};
}

S3Backend::~S3Backend() = default;

uint64_t S3Backend::requests() const { return client_->requests(); }
uint64_t S3Backend::retries() const { return client_->retries(); }
std::string S3Backend::Describe() const { return describe_; }

Result<std::unique_ptr<Backend>> OpenS3Backend(const S3Options& given) {
  S3Options options = given;
  RETURN_IF_ERROR(options.Resolve());
  ASSIGN_OR_RETURN(S3Endpoint ep, ParseS3Endpoint(options.endpoint));
  S3ClientConfig cc;
  cc.scheme = ep.scheme;
  cc.host = ep.host;
  cc.port = ep.port;
  cc.bucket = options.bucket;
  cc.path_style = UsePathStyle(options, ep);
  cc.region = options.region;
  cc.credentials = options.credentials;
  cc.max_attempts = options.max_attempts;
  cc.retry_base_ms = options.retry_base_ms;
  cc.retry_max_ms = options.retry_max_ms;
  cc.http.max_connections = options.max_connections;
  cc.http.connect_timeout_ms = options.connect_timeout_ms;
  cc.http.stall_timeout_s = options.stall_timeout_s;
  cc.http.verify_tls = options.verify_tls;
  cc.http.ca_file = options.ca_file;
  std::string url = "s3://" + options.bucket + "/" + options.prefix;
  if (url.back() == '/') url.pop_back();
  cc.describe = url;
  std::string describe = url + " (endpoint " + options.endpoint + ", region " + options.region +
                         (cc.path_style ? ", path-style)" : ", virtual-hosted)");
  ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(std::move(cc)));
  std::unique_ptr<S3Backend> backend(
      new S3Backend(std::move(options), std::move(client), std::move(describe)));
  RETURN_IF_ERROR(backend->CheckBucket());
  GetLogger("backends")->info("opened {}", backend->Describe());
  return std::unique_ptr<Backend>(std::move(backend));
}

Status S3Backend::CheckBucket() {
  S3Call call{.method = "GET",
              .query = {{"list-type", "2"}, {"max-keys", "1"}, {"prefix", options_.prefix}},
              .what = "list bucket " + options_.bucket};
  HttpResponse resp;
  Status st = client_->Send(call, &resp);
  if (!st.ok()) {
    return Status(st.code(),
                  "cannot reach the S3 endpoint " + options_.endpoint + ": " + st.message());
  }
  if (resp.status == 200) return Status::Ok();
  Status err = client_->Error(call, resp);
  if (err.code() == Code::kNotFound) {
    return NotFound("S3 bucket '" + options_.bucket + "' does not exist at " + options_.endpoint +
                    " (" + err.message() + ")");
  }
  if (err.code() == Code::kPermission) {
    return Status(Code::kPermission, "the S3 credentials were refused for bucket '" +
                                         options_.bucket + "' at " + options_.endpoint + " (" +
                                         err.message() + ")");
  }
  return err;
}

Result<size_t> S3Backend::Get(const std::string& key, uint64_t offset, void* buf, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  if (len == 0) {
    ASSIGN_OR_RETURN(ObjectInfo info, Head(key));
    (void)info;
    return size_t{0};
  }
  if (offset >= kNoObjectIsThisLarge) {
    ASSIGN_OR_RETURN(ObjectInfo info, Head(key));
    (void)info;
    return size_t{0};
  }
  uint64_t last = len - 1 > kNoObjectIsThisLarge - offset ? kNoObjectIsThisLarge : offset + len - 1;
  RangeSink sink(static_cast<char*>(buf), len, offset);
  S3Call call{
      .method = "GET",
      .key = FullKey(key),
      .headers = {{"range", "bytes=" + std::to_string(offset) + "-" + std::to_string(last)}},
      .sink = &sink};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status == 416) return size_t{0};  // the range starts at or past the end
  if (resp.status == 404) return client_->Error(call, resp);
  if (resp.status != 200 && resp.status != 206) return client_->Error(call, resp);
  // How many bytes the answer promised: a 206's Content-Range, a 200's whole length.
  uint64_t expect;
  if (resp.status == 206) {
    uint64_t start, end, total;
    const std::string* cr = resp.Header("content-range");
    if (!cr || !ParseContentRange(*cr, &start, &end, &total)) {
      return Corrupt("S3 GET " + key + " (" + describe_ + "): 206 without a valid Content-Range");
    }
    // The total may be unknown ('*'); then the range itself is the promise, within len.
    uint64_t promised = total == std::numeric_limits<uint64_t>::max()
                            ? std::min<uint64_t>(len, end - start + 1)
                            : std::min<uint64_t>(len, total - offset);
    if (end - start + 1 != promised || resp.body_bytes != promised) {
      return Corrupt("S3 GET " + key + " (" + describe_ + "): asked for " + std::to_string(len) +
                     " bytes at " + std::to_string(offset) + ", Content-Range " + *cr + ", got " +
                     std::to_string(resp.body_bytes) + " bytes");
    }
    expect = promised;
  } else {
    expect = resp.body_bytes > offset ? std::min<uint64_t>(len, resp.body_bytes - offset) : 0;
  }
  if (sink.kept() != expect) {
    return Corrupt("S3 GET " + key + " (" + describe_ + "): " + std::to_string(sink.kept()) +
                   " bytes where " + std::to_string(expect) + " were promised");
  }
  return static_cast<size_t>(expect);
}

Result<size_t> S3Backend::GetExact(const std::string& key, void* buf, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  // No Range: a 200's whole body, of which RangeSink keeps no more than len bytes.
  RangeSink sink(static_cast<char*>(buf), len, 0);
  S3Call call{.method = "GET", .key = FullKey(key), .sink = &sink};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status != 200) return client_->Error(call, resp);
  if (sink.kept() != resp.body_bytes) {  // longer than len, or not all of it written
    return Corrupt("S3 GET " + key + " (" + describe_ + "): " + std::to_string(resp.body_bytes) +
                   " bytes received where an object of " + std::to_string(len) + " was expected");
  }
  return static_cast<size_t>(sink.kept());
}

Result<std::string> S3Backend::GetObject(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  std::string data;
  StringSink sink(&data);
  S3Call call{.method = "GET", .key = FullKey(key), .sink = &sink};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status != 200) return client_->Error(call, resp);
  uint64_t len;
  const std::string* cl = resp.Header("content-length");
  if (cl && (!ParseU64(*cl, &len) || len != data.size())) {
    return Corrupt("S3 GET " + key + " (" + describe_ + "): Content-Length " + *cl + " but " +
                   std::to_string(data.size()) + " bytes");
  }
  return data;
}

Result<ObjectInfo> S3Backend::Head(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  S3Call call{.method = "HEAD", .key = FullKey(key)};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status == 404) return NotFound("no object " + key + " in " + describe_);
  if (resp.status != 200) return client_->Error(call, resp);
  ObjectInfo info{key, 0, ""};
  if (const std::string* etag = resp.Header("etag")) info.version = Unquote(*etag);
  const std::string* cl = resp.Header("content-length");
  if (!cl || !ParseU64(*cl, &info.size)) {
    return Corrupt("S3 HEAD " + key + " (" + describe_ + "): no valid Content-Length");
  }
  return info;
}

Status S3Backend::Delete(const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  S3Call call{.method = "DELETE", .key = FullKey(key)};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status == 200 || resp.status == 204) return Status::Ok();
  // An absent key is fine; an absent bucket is not.
  if (resp.status == 404 && ParseS3Error(resp.body).code != "NoSuchBucket") return Status::Ok();
  return client_->Error(call, resp);
}

Status S3Backend::List(const std::string& prefix, const std::string& start_after,
                       const std::function<bool(const ObjectInfo&)>& fn) {
  const std::string full_prefix = FullKey(prefix);
  const std::string full_after = start_after.empty() ? "" : FullKey(start_after);
  std::string token, last;
  while (true) {
    // encoding-type=url: keys come back percent-encoded, so that any byte survives the XML.
    S3Call call{.method = "GET",
                .query = {{"list-type", "2"},
                          {"encoding-type", "url"},
                          {"max-keys", std::to_string(options_.list_page_keys)},
                          {"prefix", full_prefix}},
                .what = "list " + (prefix.empty() ? std::string("(all)") : prefix)};
    if (!full_after.empty()) call.query.emplace_back("start-after", full_after);
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    HttpResponse resp;
    RETURN_IF_ERROR(client_->Send(call, &resp));
    if (resp.status != 200) return client_->Error(call, resp);
    auto doc = ParseXml(resp.body);
    if (!doc.ok()) return Corrupt("S3 list (" + describe_ + "): " + doc.status().message());
    if (doc->name != "ListBucketResult") {
      return Corrupt("S3 list (" + describe_ + "): answer is <" + doc->name + ">, not a listing");
    }
    bool url_encoded = doc->ChildText("EncodingType") == "url";
    for (const XmlElement& c : doc->children) {
      if (c.name != "Contents") continue;
      std::string key = c.ChildText("Key");
      if (url_encoded) key = UriDecode(key, true);
      ObjectInfo info;
      if (!ParseU64(c.ChildText("Size"), &info.size)) {
        return Corrupt("S3 list (" + describe_ + "): bad Size for key " + key);
      }
      if (key.compare(0, full_prefix.size(), full_prefix) != 0 || key <= full_after) {
        continue;  // outside what was asked for: a server that ignored prefix or start-after
      }
      if (!last.empty() && key <= last) {
        return Corrupt("S3 list (" + describe_ + "): keys out of order at " + key);
      }
      last = key;
      info.key = key.substr(options_.prefix.size());
      info.version = Unquote(c.ChildText("ETag"));
      if (!fn(info)) return Status::Ok();
    }
    if (doc->ChildText("IsTruncated") != "true") return Status::Ok();
    std::string next = doc->ChildText("NextContinuationToken");
    if (next.empty() || next == token) {
      return Corrupt("S3 list (" + describe_ + "): truncated listing without a new token");
    }
    token = next;
  }
}

}  // namespace ckptfs
