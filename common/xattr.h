// The extended attributes a ckptfs mount computes for its files (served by fs/file_info.cc,
// README "Attributes"), and the client side's one way to read one: `ckptfs inspect` and the GPU
// loader read them from outside the daemon.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace ckptfs {

inline constexpr std::string_view kXattrFormat = "user.ckptfs.format";
inline constexpr std::string_view kXattrTensors = "user.ckptfs.tensors";  // page N: ".N"
inline constexpr std::string_view kXattrTensorPages = "user.ckptfs.tensors.pages";

// The value of attribute `name` of the file at `path`, asking again when it changes size between
// the size query and the read. Errors: Status::FromErrno of getxattr's errno (also stored in
// *err when given, for callers that give one errno a meaning of their own); Code::kBusy when it
// keeps changing.
Result<std::string> ReadXattr(const std::string& path, const std::string& name, int* err = nullptr);

}  // namespace ckptfs
