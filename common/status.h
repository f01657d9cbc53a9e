// Status and Result<T>: the one error currency of ckptfs.
//
// No exception crosses a layer boundary. Every fallible call returns Status or Result<T>; errno is
// produced in exactly one place, ToErrno(), which only the FUSE layer calls.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace ckptfs {

enum class Code : uint8_t {
  kOk = 0,
  kNotFound,      // ENOENT: expected in normal operation, never logged as an error
  kExists,        // EEXIST
  kNotDir,        // ENOTDIR
  kIsDir,         // EISDIR
  kNotEmpty,      // ENOTEMPTY
  kNoSpace,       // ENOSPC: the local tier is full
  kIo,            // EIO: an I/O call failed
  kCorrupt,       // EIO: stored bytes do not match their name, or metadata does not decode
  kInvalid,       // EINVAL
  kPermission,    // EPERM
  kNameTooLong,   // ENAMETOOLONG
  kBusy,          // EBUSY
  kUnsupported,   // EOPNOTSUPP
  kNoData,        // ENODATA: no such extended attribute
  kRange,         // ERANGE: a caller's buffer is too small
  kTooBig,        // EFBIG
  kValueTooLarge, // E2BIG: an attribute value larger than the kernel passes (64 KiB)
  kCrossDevice,   // EXDEV
  kInternal,      // EIO: a broken invariant inside ckptfs
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}

  static Status Ok() { return Status(); }
  // Maps an errno value from a failed system call to a Status; `what` says which call on what.
  static Status FromErrno(int err, std::string what);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string msg_;
};

// The single Code -> errno table. Only fs/ calls this.
int ToErrno(const Status& s);
const char* CodeName(Code c);

inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status Invalid(std::string m) { return {Code::kInvalid, std::move(m)}; }
inline Status Corrupt(std::string m) { return {Code::kCorrupt, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status IoError(std::string m) { return {Code::kIo, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like expected<T>
  Result(Status s) : v_(std::move(s)) {}      // NOLINT

  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<1>(v_);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ckptfs

#define CKPTFS_CONCAT_INNER(a, b) a##b
#define CKPTFS_CONCAT(a, b) CKPTFS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    ::ckptfs::Status _st = (expr);            \
    if (!_st.ok()) return _st;                \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(CKPTFS_CONCAT(_res_, __LINE__), lhs, expr)
