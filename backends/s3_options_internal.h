// Pieces of S3Options handling shared by s3_options.cc and s3_backend.cc (and their tests).
#pragma once

#include <string>

#include "backends/s3_backend.h"
#include "common/status.h"

namespace ckptfs {

struct S3Endpoint {
  std::string scheme;  // "http" or "https"
  std::string host;    // lower case; "[v6]" for an IPv6 literal
  int port = 0;        // 0: the scheme's default
};

// "http(s)://host[:port][/]" -> its parts; kInvalid for anything else, and for a URL with a
// user name or password (which the message then does not repeat).
Result<S3Endpoint> ParseS3Endpoint(const std::string& url);

// The addressing style `o` asks for, kAuto decided for this endpoint and bucket.
bool UsePathStyle(const S3Options& o, const S3Endpoint& ep);

}  // namespace ckptfs
