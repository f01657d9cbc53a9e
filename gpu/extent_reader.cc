#include "gpu/extent_reader.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace ckptfs::gpu {
namespace {

// The kernel moves at most about 2 GiB per read; stay well below it.
constexpr size_t kMaxRequest = size_t{1} << 30;

size_t NextLen(const ReadOp& op, size_t max_op_bytes) {
  size_t n = std::min(op.len - op.done, kMaxRequest);
  return max_op_bytes ? std::min(n, max_op_bytes) : n;
}

// Applies one completed request of `res` bytes (or -errno) to op. Returns true when op is
// finished (full or failed); *st gets the failure.
bool Advance(ReadOp& op, int64_t res, Status* st) {
  if (res == -EINTR || res == -EAGAIN) return false;
  if (res < 0) {
    *st = Status::FromErrno(static_cast<int>(-res), "read");
    return true;
  }
  if (res == 0) {
    *st = Corrupt("end of file at byte " + std::to_string(op.offset + op.done));
    return true;
  }
  op.done += static_cast<size_t>(res);
  return op.done >= op.len;
}

class PreadReader final : public ExtentReader {
 public:
  explicit PreadReader(size_t max_op_bytes) : max_op_bytes_(max_op_bytes) {}
  const char* name() const override { return "pread"; }

  Status ReadAll(int fd, std::span<ReadOp> ops, size_t* failed) override {
    for (size_t i = 0; i < ops.size(); ++i) {
      ReadOp& op = ops[i];
      op.done = 0;
      Status st;
      bool finished = op.len == 0;
      while (!finished) {
        ssize_t r = ::pread(fd, op.dst + op.done, NextLen(op, max_op_bytes_),
                            static_cast<off_t>(op.offset + op.done));
        finished = Advance(op, r < 0 ? -errno : r, &st);
      }
      if (!st.ok()) {
        *failed = i;
        return st;
      }
    }
    return Status::Ok();
  }

 private:
  const size_t max_op_bytes_;
};

class UringReader final : public ExtentReader {
 public:
  UringReader(unsigned depth, size_t max_op_bytes) : depth_(depth), max_op_bytes_(max_op_bytes) {}
  ~UringReader() override {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  const char* name() const override { return "uring"; }

  Status Init() {
    int rc = io_uring_queue_init(depth_, &ring_, 0);
    if (rc < 0) return Status::FromErrno(-rc, "io_uring_queue_init");
    ready_ = true;
    return Status::Ok();
  }

  Status ReadAll(int fd, std::span<ReadOp> ops, size_t* failed) override {
    Status first;
    size_t next = 0;              // ops[next..] have not been started
    std::vector<size_t> requeue;  // started ops with bytes still to read
    unsigned in_flight = 0;
    for (ReadOp& op : ops) op.done = 0;
    auto fail = [&](size_t i, Status st) {
      if (first.ok()) {
        first = std::move(st);
        *failed = i;
      }
    };
    while (in_flight > 0 || (first.ok() && (next < ops.size() || !requeue.empty()))) {
      // After a failure nothing new is submitted; what is in flight is still reaped.
      while (first.ok() && in_flight < depth_ && (!requeue.empty() || next < ops.size())) {
        size_t i;
        if (!requeue.empty()) {
          i = requeue.back();
          requeue.pop_back();
        } else {
          i = next++;
          if (ops[i].len == 0) continue;
        }
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (!sqe) {  // cannot happen with in_flight < depth, but never lose an op
          requeue.push_back(i);
          break;
        }
        ReadOp& op = ops[i];
        io_uring_prep_read(sqe, fd, op.dst + op.done, static_cast<unsigned>(NextLen(op, max_op_bytes_)),
                           op.offset + op.done);
        io_uring_sqe_set_data64(sqe, i);
        ++in_flight;
      }
      if (in_flight == 0) continue;
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring itself failed. What it accepted still completes: reap it before returning.
        fail(next > 0 ? next - 1 : 0, Status::FromErrno(-rc, "io_uring_submit"));
        while (in_flight > 0) {
          io_uring_cqe* cqe;
          if (io_uring_wait_cqe(&ring_, &cqe) < 0) break;
          io_uring_cqe_seen(&ring_, cqe);
          --in_flight;
        }
        break;
      }
      io_uring_cqe* cqe;
      while (in_flight > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0) {
        size_t i = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        --in_flight;
        Status st;
        if (!Advance(ops[i], res, &st)) {
          requeue.push_back(i);
        } else if (!st.ok()) {
          fail(i, std::move(st));
        }
      }
    }
    return first;
  }

 private:
  const unsigned depth_;
  const size_t max_op_bytes_;
  io_uring ring_{};
  bool ready_ = false;
};

}  // namespace

Result<std::unique_ptr<ExtentReader>> NewExtentReader(const LoadOptions& options) {
  if (options.engine == "pread") {
    return std::unique_ptr<ExtentReader>(new PreadReader(options.max_op_bytes));
  }
  if (options.engine != "uring") return Invalid("unknown read engine '" + options.engine + "'");
  const unsigned depth = std::clamp(options.queue_depth, 1u, 4096u);
  auto r = std::make_unique<UringReader>(depth, options.max_op_bytes);
  if (!r->Init().ok()) {
    // A kernel (or seccomp profile, as in many containers) without io_uring: read one at a time.
    return std::unique_ptr<ExtentReader>(new PreadReader(options.max_op_bytes));
  }
  return std::unique_ptr<ExtentReader>(std::move(r));
}

void AppendPieces(size_t extent, char* dst, uint64_t offset, uint64_t len, size_t piece_bytes,
                  std::vector<ReadOp>* ops) {
  const uint64_t piece = piece_bytes ? piece_bytes : len;
  for (uint64_t done = 0; done < len;) {
    const size_t n = static_cast<size_t>(std::min(piece, len - done));
    ops->push_back(ReadOp{dst + done, offset + done, n, extent});
    done += n;
  }
}

}  // namespace ckptfs::gpu
