// S3Backend::Put: one PUT up to the part size, a parallel multipart upload above it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "backends/s3_backend.h"
#include "backends/s3_client.h"
#include "backends/s3_xml.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMaxParts = 10000;  // S3's limit per upload

}  // namespace

Status S3Backend::Put(const std::string& key, const void* data, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  if (len > options_.multipart_part_bytes) {
    return PutMultipart(key, static_cast<const char*>(data), len);
  }
  // The body's real SHA-256 is signed (not UNSIGNED-PAYLOAD): S3 then checks the bytes it
  // received against it and refuses a body damaged on the way, so a Put that returns OK stored
  // exactly these bytes, over http too.
  S3Call call{.method = "PUT", .key = FullKey(key), .body = data, .body_len = len};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status == 200) return Status::Ok();
  return client_->Error(call, resp);
}

Status S3Backend::PutIfAbsent(const std::string& key, const void* data, size_t len) {
  RETURN_IF_ERROR(CheckKey(key));
  if (len > options_.multipart_part_bytes) {
    return Invalid("a conditional put of " + key + " is larger than one part");
  }
  S3Call call{.method = "PUT",
              .key = FullKey(key),
              .headers = {{"if-none-match", "*"}},
              .body = data,
              .body_len = len};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(call, &resp));
  if (resp.status == 200) return Status::Ok();
  // 412: the key exists. 409 (ConditionalRequestConflict): a concurrent conditional write of it
  // is in flight; it will exist, or be free again.
  if (resp.status == 412) return Status(Code::kExists, key + " exists in " + describe_);
  if (resp.status == 409) return Status(Code::kBusy, "conditional put of " + key + ": conflict");
  return client_->Error(call, resp);
}

Status S3Backend::PutMultipart(const std::string& key, const char* data, size_t len) {
  const std::string full = FullKey(key);
  uint64_t part =
      std::max<uint64_t>(options_.multipart_part_bytes, (len + kMaxParts - 1) / kMaxParts);
  const size_t nparts = static_cast<size_t>((len + part - 1) / part);

  S3Call create{.method = "POST",
                .key = full,
                .query = {{"uploads", ""}},
                .headers = {{"content-type", "application/octet-stream"}},
                .what = "create multipart upload " + key};
  HttpResponse resp;
  RETURN_IF_ERROR(client_->Send(create, &resp));
  if (resp.status != 200) return client_->Error(create, resp);
  auto doc = ParseXml(resp.body);
  std::string upload_id = doc.ok() ? doc->ChildText("UploadId") : "";
  if (upload_id.empty()) {
    return Corrupt("S3 create multipart upload " + key + " (" + describe_ + "): no UploadId in " +
                   "the answer");
  }

  // Parts go up from a few threads of our own; each signs and hashes its own part.
  std::vector<std::string> etags(nparts);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;  // guarded by mu
  auto fail = [&](Status st) {
    std::lock_guard lock(mu);
    if (first_error.ok()) first_error = std::move(st);
    failed = true;
  };
  auto worker = [&] {
    while (!failed.load()) {
      size_t i = next.fetch_add(1);
      if (i >= nparts) return;
      uint64_t off = i * part;
      S3Call put{.method = "PUT",
                 .key = full,
                 .query = {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}},
                 .body = data + off,
                 .body_len = static_cast<size_t>(std::min<uint64_t>(part, len - off)),
                 .what = "upload part " + std::to_string(i + 1) + " of " + key};
      HttpResponse r;
      Status st = client_->Send(put, &r);
      if (st.ok() && r.status != 200) st = client_->Error(put, r);
      const std::string* etag = r.Header("etag");
      if (st.ok() && (!etag || etag->empty())) {
        st = Corrupt("S3 upload part " + std::to_string(i + 1) + " of " + key + ": no ETag");
      }
      if (!st.ok()) return fail(std::move(st));
      etags[i] = *etag;
    }
  };
  size_t nthreads =
      std::min<size_t>({nparts, options_.multipart_parallel, options_.max_connections});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < nthreads; ++t) {
    try {
      threads.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // no thread to be had: fewer parts in flight, same result
    }
  }
  worker();
  for (std::thread& t : threads) t.join();

  Status st = first_error;
  if (st.ok()) {
    std::string body = "<CompleteMultipartUpload>";
    for (size_t i = 0; i < nparts; ++i) {
      body += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
              XmlEscape(etags[i]) + "</ETag></Part>";
    }
    body += "</CompleteMultipartUpload>";
    S3Call complete{.method = "POST",
                    .key = full,
                    .query = {{"uploadId", upload_id}},
                    .headers = {{"content-type", "application/xml"}},
                    .body = body.data(),
                    .body_len = body.size(),
                    .what = "complete multipart upload " + key};
    // S3 may answer 200 and still fail, with an <Error> body; some of those say "try again".
    for (uint32_t attempt = 0; attempt < options_.max_attempts; ++attempt) {
      HttpResponse r;
      st = client_->Send(complete, &r);
      if (!st.ok()) break;
      if (r.status != 200) {
        st = client_->Error(complete, r);
        // A retried Complete whose first try succeeded finds the upload gone; radosgw answers
        // it without an ETag, so the object's size is the check that it landed.
        if (st.code() == Code::kNotFound && ParseS3Error(r.body).code == "NoSuchUpload") {
          auto info = Head(key);
          if (info.ok() && info->size == len) st = Status::Ok();
        }
        break;
      }
      auto result = ParseXml(r.body);
      if (result.ok() && result->name == "CompleteMultipartUploadResult") {
        break;  // done; its ETag may be empty (radosgw) and is not used
      }
      S3ErrorInfo err = ParseS3Error(r.body);
      if (err.code.empty()) {
        // Neither a result nor an error (a cut-off body): the object's size decides.
        auto info = Head(key);
        if (!info.ok() || info->size != len) {
          st = Corrupt("S3 complete multipart upload " + key + " (" + describe_ +
                       "): an answer that is neither a result nor an error");
        }
        break;
      }
      st = IoError("S3 complete multipart upload " + key + " (" + describe_ + "): " + err.code +
                   ": " + err.message);
      if (err.code != "InternalError" && err.code != "SlowDown" &&
          err.code != "ServiceUnavailable") {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(
          std::min<uint64_t>(options_.retry_max_ms, uint64_t{options_.retry_base_ms} << attempt)));
    }
    if (st.ok()) return st;
  }
  // Parts of an abandoned upload are billed until aborted.
  S3Call abort{.method = "DELETE",
               .key = full,
               .query = {{"uploadId", upload_id}},
               .what = "abort multipart upload " + key};
  HttpResponse r;
  Status ast = client_->Send(abort, &r);
  if (ast.ok() && r.status != 204 && r.status != 200 && r.status != 404) {
    ast = client_->Error(abort, r);
  }
  if (!ast.ok()) GetLogger("backends")->warn("{}", ast.message());
  return st;
}

}  // namespace ckptfs
