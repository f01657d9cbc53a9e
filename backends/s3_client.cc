#include "backends/s3_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>
#include <thread>

#include "backends/s3_xml.h"

namespace ckptfs {
namespace {

// S3 error Codes that mean "try again later", whatever the HTTP status they came with.
bool RetryableCode(const std::string& code) {
  static const char* const kCodes[] = {"SlowDown",
                                       "Throttling",
                                       "ThrottlingException",
                                       "RequestLimitExceeded",
                                       "TooManyRequests",
                                       "RequestThrottled",
                                       "InternalError",
                                       "ServiceUnavailable",
                                       "RequestTimeout",
                                       "RequestTimeoutException",
                                       "OperationAborted"};
  return std::any_of(std::begin(kCodes), std::end(kCodes),
                     [&](const char* c) { return code == c; });
}

bool RetryableStatus(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

// Full jitter: a uniform pick in [0, min(cap, base * 2^attempt)).
std::chrono::milliseconds Backoff(uint32_t attempt, uint32_t base_ms, uint32_t max_ms) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t ceiling = std::min<uint64_t>(max_ms, uint64_t{base_ms} << std::min(attempt, 30u));
  if (ceiling == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::uniform_int_distribution<uint64_t>(0, ceiling - 1)(rng));
}

}  // namespace

S3ErrorInfo ParseS3Error(const std::string& body) {
  S3ErrorInfo info;
  if (body.empty()) return info;
  auto doc = ParseXml(body);
  if (!doc.ok() || doc->name != "Error") return info;
  info.code = doc->ChildText("Code");
  info.message = doc->ChildText("Message");
  return info;
}

Result<std::unique_ptr<S3Client>> S3Client::Create(S3ClientConfig config) {
  ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> http, HttpClient::Create(config.http));
  return std::unique_ptr<S3Client>(new S3Client(std::move(config), std::move(http)));
}

S3Client::S3Client(S3ClientConfig config, std::unique_ptr<HttpClient> http)
    : config_(std::move(config)),
      signer_(config_.credentials, config_.region, "s3"),
      http_(std::move(http)),
      log_(GetLogger("backends")) {
  int default_port = config_.scheme == "https" ? 443 : 80;
  std::string host = config_.path_style ? config_.host : config_.bucket + "." + config_.host;
  // append, not `":" + ...`: GCC 12 at -O3 warns (-Wrestrict) inside that operator+.
  if (config_.port != 0 && config_.port != default_port) {
    host.append(":").append(std::to_string(config_.port));
  }
  host_header_ = host;
  base_url_ = config_.scheme + "://" + host;
  // The secret stays in the signer only.
  config_.credentials = AwsCredentials{};
}

std::string S3Client::What(const S3Call& call) const {
  if (!call.what.empty()) return call.what;
  return call.method + " " + (call.key.empty() ? "bucket " + config_.bucket : call.key);
}

Status S3Client::Send(const S3Call& call, HttpResponse* resp) {
  SigV4Request sreq;
  sreq.method = call.method;
  sreq.host = host_header_;
  sreq.path = config_.path_style ? "/" + config_.bucket : "";
  if (!call.key.empty() || !config_.path_style) sreq.path += "/" + call.key;
  sreq.query = call.query;
  sreq.headers = call.headers;
  sreq.payload_sha256 =
      call.payload_sha256.empty() ? Sha256Hex(call.body, call.body_len) : call.payload_sha256;
  HttpRequest hreq;
  hreq.method = call.method;
  hreq.url = base_url_ + EncodePath(sreq.path);
  if (!call.query.empty()) hreq.url.append("?").append(CanonicalQuery(call.query));
  hreq.body = call.body;
  hreq.body_len = call.body_len;
  hreq.sink = call.sink;

  Status last;
  for (uint32_t attempt = 0;; ++attempt) {
    if (attempt > 0) {
      retries_.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(
          Backoff(attempt - 1, config_.retry_base_ms, config_.retry_max_ms));
    }
    if (call.sink) call.sink->Reset();
    // Signed anew each try: the date in the signature must be close to the server's clock.
    SigV4Signature sig = signer_.Sign(sreq, std::time(nullptr));
    hreq.headers = call.headers;
    hreq.headers.insert(hreq.headers.end(), sig.headers.begin(), sig.headers.end());
    requests_.fetch_add(1, std::memory_order_relaxed);
    bool retryable = false;
    Status st = http_->Perform(hreq, resp, &retryable);
    if (st.ok()) {
      if (resp->status < 300) return Status::Ok();
      S3ErrorInfo err = ParseS3Error(resp->body);
      retryable = RetryableStatus(resp->status) || RetryableCode(err.code);
      if (!retryable) return Status::Ok();  // an answer for the caller to judge
      last = Error(call, *resp);
    } else {
      if (!retryable) {
        return Status(st.code(),
                      "S3 " + What(call) + " (" + config_.describe + "): " + st.message());
      }
      last = IoError("S3 " + What(call) + " (" + config_.describe + "): " + st.message());
    }
    if (attempt + 1 >= config_.max_attempts) {
      return IoError(last.message() + " (gave up after " + std::to_string(attempt + 1) + " tries)");
    }
    log_->debug("retrying: {}", last.message());
  }
}

Status S3Client::Error(const S3Call& call, const HttpResponse& resp) const {
  S3ErrorInfo err = ParseS3Error(resp.body);
  long s = resp.status;
  Code code = Code::kIo;
  if (s == 404) {
    code = Code::kNotFound;
  } else if (s == 401 || s == 403) {
    code = Code::kPermission;
  } else if (s == 400) {
    bool auth = err.code == "ExpiredToken" || err.code == "InvalidToken" ||
                err.code == "TokenRefreshRequired" || err.code == "AuthorizationHeaderMalformed" ||
                err.code == "InvalidAccessKeyId";
    code = auth ? Code::kPermission : Code::kInvalid;
  } else if (s == 301 || s == 307 || s == 308) {
    code = Code::kInvalid;
  } else if (s == 405 || s == 501) {
    code = Code::kUnsupported;
  } else if (s == 409) {
    code = Code::kBusy;
  } else if (s == 416) {
    code = Code::kRange;
  }
  std::string msg = "S3 " + What(call) + " (" + config_.describe + "): HTTP " + std::to_string(s);
  if (!err.code.empty()) msg += " " + err.code;
  if (!err.message.empty()) msg += ": " + err.message;
  if (const std::string* region = resp.Header("x-amz-bucket-region")) {
    msg += " (the bucket is in region " + *region + ", not " + config_.region + ")";
  }
  if (const std::string* id = resp.Header("x-amz-request-id")) msg += " [request " + *id + "]";
  return Status(code, msg);
}

}  // namespace ckptfs
