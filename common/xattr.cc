#include "common/xattr.h"

#include <sys/xattr.h>

#include <cerrno>

namespace ckptfs {

Result<std::string> ReadXattr(const std::string& path, const std::string& name, int* err) {
  auto fail = [&](int e) {
    if (err) *err = e;
    return Status::FromErrno(e, name);
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    ssize_t n = ::getxattr(path.c_str(), name.c_str(), nullptr, 0);
    if (n < 0) return fail(errno);
    std::string v(static_cast<size_t>(n), '\0');
    ssize_t got = ::getxattr(path.c_str(), name.c_str(), v.data(), v.size());
    if (got < 0 && errno == ERANGE) continue;  // the file changed between the calls
    if (got < 0) return fail(errno);
    v.resize(static_cast<size_t>(got));
    return v;
  }
  return Status(Code::kBusy, name + " keeps changing");
}

}  // namespace ckptfs
