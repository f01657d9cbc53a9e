#include "backends/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace ckptfs {
namespace {

// Bodies kept in memory (error documents, listings) are bounded: S3 never sends more than about
// 1 MiB for a 1000-key listing, so a larger one is a server that lies.
constexpr size_t kMaxMemoryBody = 16u << 20;
constexpr long kReceiveBuffer = 256 * 1024;
constexpr long kUploadBuffer = 512 * 1024;

std::once_flag g_curl_init;
CURLcode g_curl_init_result = CURLE_OK;

struct Transfer {
  const HttpRequest* req;
  HttpResponse* resp;
  size_t upload_pos = 0;
  bool refused = false;
  std::string why;
};

size_t OnHeader(char* data, size_t size, size_t n, void* userp) {
  auto* t = static_cast<Transfer*>(userp);
  std::string_view line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.substr(0, 5) == "HTTP/") {
    // A new response (after a 1xx interim one, or the first): its headers replace any before.
    t->resp->headers.clear();
    size_t sp = line.find(' ');
    t->resp->status =
        sp == std::string_view::npos ? 0 : std::atol(std::string(line.substr(sp + 1, 3)).c_str());
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string_view value = line.substr(colon + 1);
    size_t b = value.find_first_not_of(" \t");
    value = b == std::string_view::npos ? std::string_view() : value.substr(b);
    size_t e = value.find_last_not_of(" \t");
    value = value.substr(0, e == std::string_view::npos ? 0 : e + 1);
    t->resp->headers.emplace_back(std::move(name), std::string(value));
  }
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* userp) {
  auto* t = static_cast<Transfer*>(userp);
  size_t len = size * n;
  HttpResponse* resp = t->resp;
  bool success = resp->status >= 200 && resp->status < 300;
  if (success && t->req->sink) {
    if (!t->req->sink->Write(*resp, data, len)) {
      t->refused = true;
      t->why = t->req->sink->Why();
      return 0;  // anything but len aborts the transfer
    }
  } else {
    if (resp->body.size() + len > kMaxMemoryBody) {
      t->refused = true;
      t->why = "a response body larger than " + std::to_string(kMaxMemoryBody) + " bytes";
      return 0;
    }
    resp->body.append(data, len);
  }
  resp->body_bytes += len;
  return len;
}

size_t OnRead(char* buf, size_t size, size_t n, void* userp) {
  auto* t = static_cast<Transfer*>(userp);
  size_t left = t->req->body_len - t->upload_pos;
  size_t k = std::min(left, size * n);
  if (k) std::memcpy(buf, static_cast<const char*>(t->req->body) + t->upload_pos, k);
  t->upload_pos += k;
  return k;
}

int OnSeek(void* userp, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(userp);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->req->body_len) {
    return CURL_SEEKFUNC_FAIL;
  }
  t->upload_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

bool Retryable(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

}  // namespace

const std::string* HttpResponse::Header(std::string_view lname) const {
  for (const auto& [name, value] : headers) {
    if (name == lname) return &value;
  }
  return nullptr;
}

struct HttpClient::Shared {
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];

  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* userp) {
    static_cast<Shared*>(userp)->locks[data].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* userp) {
    static_cast<Shared*>(userp)->locks[data].unlock();
  }
};

Result<std::unique_ptr<HttpClient>> HttpClient::Create(const Options& options) {
  std::call_once(g_curl_init, [] { g_curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (g_curl_init_result != CURLE_OK) {
    return IoError(std::string("libcurl initialization failed: ") +
                   curl_easy_strerror(g_curl_init_result));
  }
  std::unique_ptr<HttpClient> client(new HttpClient(options));
  if (!client->shared_->share) return IoError("curl_share_init failed");
  return client;
}

HttpClient::HttpClient(const Options& options) : options_(options), shared_(new Shared) {
  if (options_.max_connections == 0) options_.max_connections = 1;
  CURLSH* sh = curl_share_init();
  if (!sh) return;
  // DNS answers and TLS sessions are shared; each pooled handle keeps its own connection.
  curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, &Shared::Lock);
  curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, &Shared::Unlock);
  curl_share_setopt(sh, CURLSHOPT_USERDATA, shared_.get());
  curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
  curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  shared_->share = sh;
}

HttpClient::~HttpClient() {
  // REQUIRES: no Perform in flight, so every handle is idle.
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
  if (shared_->share) curl_share_cleanup(shared_->share);
}

void* HttpClient::Acquire() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !idle_.empty() || live_ < options_.max_connections; });
  if (!idle_.empty()) {
    void* h = idle_.back();
    idle_.pop_back();
    return h;
  }
  CURL* h = curl_easy_init();
  if (h) ++live_;
  return h;
}

void HttpClient::Release(void* handle) {
  {
    std::lock_guard lock(mu_);
    idle_.push_back(handle);
  }
  cv_.notify_one();
}

Status HttpClient::Perform(const HttpRequest& req, HttpResponse* resp, bool* retryable) {
  *retryable = false;
  *resp = HttpResponse{};
  CURL* h = static_cast<CURL*>(Acquire());
  if (!h) return IoError("curl_easy_init failed");
  // Reset keeps the handle's live connection, which is the point of the pool.
  curl_easy_reset(h);
  Transfer t{&req, resp};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  // The path is sent as signed: libcurl must not squash "/./" or "/../" in it.
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_SHARE, shared_->share);
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.stall_timeout_s));
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, kReceiveBuffer);
  curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, kUploadBuffer);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
  if (!options_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options_.ca_file.c_str());
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);

  Status st;
  if (req.method == "GET") {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (req.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, &OnRead);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &OnSeek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body_len));
  } else if (req.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body ? req.body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_len));
  } else if (req.method == "DELETE") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  } else {
    st = Invalid("unsupported HTTP method " + req.method);
  }

  curl_slist* list = nullptr;
  bool list_ok = true;
  auto add = [&](const std::string& line) {
    curl_slist* next = curl_slist_append(list, line.c_str());
    if (next) list = next;
    list_ok = list_ok && next;
  };
  for (const auto& [name, value] : req.headers) add(name + ": " + value);
  // Neither "Expect: 100-continue" (a round trip per upload) nor curl's form content type.
  add("Expect:");
  if (req.method == "POST" && !std::any_of(req.headers.begin(), req.headers.end(), [](auto& kv) {
        return strcasecmp(kv.first.c_str(), "content-type") == 0;
      })) {
    add("Content-Type:");
  }
  if (!list_ok) st = IoError("out of memory building HTTP headers");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);

  if (st.ok()) {
    CURLcode rc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    if (code) resp->status = code;
    if (t.refused) {
      st = Corrupt(t.why);
    } else if (rc != CURLE_OK) {
      *retryable = Retryable(rc);
      st = IoError(std::string(curl_easy_strerror(rc)) +
                   (errbuf[0] ? std::string(" (") + errbuf + ")" : ""));
    }
  }
  curl_slist_free_all(list);
  // Nothing of this request may stay attached to the pooled handle.
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
  Release(h);
  return st;
}

}  // namespace ckptfs
