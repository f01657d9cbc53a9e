#include "backends/open.h"

#include "backends/fault_backend.h"
#include "backends/posix_backend.h"
#include "backends/s3_backend.h"

namespace ckptfs {

Result<std::unique_ptr<Backend>> OpenBackend(const BackendSpec& spec) {
  std::unique_ptr<Backend> b;
  if (spec.url.rfind("file://", 0) == 0) {
    const std::string root = spec.url.substr(7);
    if (root.empty() || root[0] != '/') {
      return Invalid("backend " + spec.url + ": file:// needs an absolute path (file:///data)");
    }
    ASSIGN_OR_RETURN(auto posix, PosixBackend::Open(root));
    b = std::move(posix);
  } else if (spec.url.rfind("s3://", 0) == 0) {
    S3Options o;
    RETURN_IF_ERROR(ParseS3Url(spec.url, &o));
    o.endpoint = spec.s3_endpoint;
    ASSIGN_OR_RETURN(b, OpenS3Backend(std::move(o)));
  } else {
    return Invalid("backend '" + spec.url + "': expected file:///PATH or s3://BUCKET[/PREFIX]");
  }
  if (spec.faults.empty()) return b;
  ASSIGN_OR_RETURN(auto faulty, FaultBackend::Wrap(std::move(b), spec.faults));
  return std::unique_ptr<Backend>(std::move(faulty));
}

}  // namespace ckptfs
