// Opens the backend a mount option names.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.h"
#include "common/status.h"

namespace ckptfs {

struct BackendSpec {
  // "file:///PATH" (a directory that exists, e.g. on Lustre/NFS/GPFS) or "s3://BUCKET[/PREFIX]".
  std::string url;
  // For s3: the endpoint ("http://127.0.0.1:7480"); empty: $AWS_ENDPOINT_URL, else AWS.
  std::string s3_endpoint;
  // Tests: faults injected around the backend (FaultSpec::Parse's syntax); empty: none.
  std::string faults;
};

// kInvalid for a URL of another scheme; otherwise what the backend's own Open says (a bucket that
// does not exist, refused credentials, a missing directory), so that a mount fails at once.
Result<std::unique_ptr<Backend>> OpenBackend(const BackendSpec& spec);

}  // namespace ckptfs
