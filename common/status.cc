#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace ckptfs {
namespace {

struct Entry {
  Code code;
  int err;
  const char* name;
};

// The one table. A Code appears once; FromErrno reads it backwards for the errnos listed here.
constexpr Entry kTable[] = {
    {Code::kOk, 0, "ok"},
    {Code::kNotFound, ENOENT, "not found"},
    {Code::kExists, EEXIST, "exists"},
    {Code::kNotDir, ENOTDIR, "not a directory"},
    {Code::kIsDir, EISDIR, "is a directory"},
    {Code::kNotEmpty, ENOTEMPTY, "directory not empty"},
    {Code::kNoSpace, ENOSPC, "no space"},
    {Code::kIo, EIO, "I/O error"},
    {Code::kCorrupt, EIO, "corrupt"},
    {Code::kInvalid, EINVAL, "invalid argument"},
    {Code::kPermission, EPERM, "not permitted"},
    {Code::kNameTooLong, ENAMETOOLONG, "name too long"},
    {Code::kBusy, EBUSY, "busy"},
    {Code::kUnsupported, EOPNOTSUPP, "not supported"},
    {Code::kNoData, ENODATA, "no data"},
    {Code::kRange, ERANGE, "out of range"},
    {Code::kTooBig, EFBIG, "file too big"},
    {Code::kValueTooLarge, E2BIG, "value too large"},
    {Code::kCrossDevice, EXDEV, "cross-device"},
    {Code::kInternal, EIO, "internal error"},
};

const Entry& Lookup(Code c) {
  for (const Entry& e : kTable) {
    if (e.code == c) return e;
  }
  return kTable[sizeof(kTable) / sizeof(kTable[0]) - 1];
}

}  // namespace

Status Status::FromErrno(int err, std::string what) {
  Code code = Code::kIo;
  if (err == EDQUOT) {
    code = Code::kNoSpace;
  } else {
    for (const Entry& e : kTable) {
      if (e.err == err && e.code != Code::kCorrupt && e.code != Code::kInternal) {
        code = e.code;
        break;
      }
    }
  }
  return Status(code, what + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + msg_;
}

int ToErrno(const Status& s) { return Lookup(s.code()).err; }

const char* CodeName(Code c) { return Lookup(c).name; }

}  // namespace ckptfs
