#include "cache/io_engine.h"

#include <liburing.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <vector>

#include "common/log.h"

namespace ckptfs {

Result<size_t> IoEngine::ReadAt(int fd, void* buf, size_t len, int64_t offset, bool direct) {
  IoOp op{IoOp::Kind::kRead, fd, buf, len, offset};
  op.direct = direct;
  RETURN_IF_ERROR(Submit(std::span<IoOp>(&op, 1)));
  return op.done;
}

Status IoEngine::WriteAt(int fd, const void* buf, size_t len, int64_t offset) {
  IoOp op{IoOp::Kind::kWrite, fd, const_cast<void*>(buf), len, offset};
  return Submit(std::span<IoOp>(&op, 1));
}

namespace {

// How many bytes the next request of `op` asks for.
size_t NextLen(const IoOp& op, size_t max_op_bytes) {
  size_t left = op.len - op.done;
  return max_op_bytes ? std::min(left, max_op_bytes) : left;
}

int64_t NextOffset(const IoOp& op) {
  return op.offset < 0 ? -1 : op.offset + static_cast<int64_t>(op.done);
}

// Applies one completed request of `res` bytes (or -errno) to op. Returns true when op is
// finished (fully done, at end of file, or failed).
bool Advance(IoOp& op, ssize_t res, int* zero_writes) {
  if (res == -EINTR || res == -EAGAIN) return false;
  if (res < 0) {
    op.status = Status::FromErrno(static_cast<int>(-res),
                                  op.kind == IoOp::Kind::kRead ? "read" : "write");
    return true;
  }
  if (res == 0) {
    if (op.kind == IoOp::Kind::kRead) return true;  // end of file
    // A write that moves nothing will not move anything next time either.
    if (++*zero_writes > 3) {
      op.status = IoError("write made no progress");
      return true;
    }
    return false;
  }
  op.done += static_cast<size_t>(res);
  // (ext4 and XFS answer 0 there anyway; a filesystem that checks alignment first would not.)
  if (op.kind == IoOp::Kind::kRead && op.direct && op.done % kDirectAlign != 0) return true;
  return op.done >= op.len;
}

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(size_t max_op_bytes) : max_op_bytes_(max_op_bytes) {}
  const char* name() const override { return "pread"; }

  Status Submit(std::span<IoOp> ops) override {
    Status first;
    for (IoOp& op : ops) {
      op.done = 0;
      op.status = Status::Ok();
      int zero_writes = 0;
      bool finished = op.len == 0;
      while (!finished) {
        size_t n = NextLen(op, max_op_bytes_);
        char* p = static_cast<char*>(op.buf) + op.done;
        int64_t off = NextOffset(op);
        ssize_t r;
        if (op.kind == IoOp::Kind::kRead) {
          r = off < 0 ? ::read(op.fd, p, n) : ::pread(op.fd, p, n, off);
        } else {
          r = off < 0 ? ::write(op.fd, p, n) : ::pwrite(op.fd, p, n, off);
        }
        finished = Advance(op, r < 0 ? -errno : r, &zero_writes);
      }
      if (!op.status.ok() && first.ok()) first = op.status;
    }
    return first;
  }

 private:
  size_t max_op_bytes_;
};

// One ring per concurrent submitter, taken from a pool: FUSE worker threads come and go, and a
// ring must not be shared by two threads without a lock around both submit and reap.
class UringEngine final : public IoEngine {
 public:
  UringEngine(unsigned depth, size_t max_op_bytes) : depth_(depth), max_op_bytes_(max_op_bytes) {}
  ~UringEngine() override {
    for (io_uring* r : free_) {
      io_uring_queue_exit(r);
      delete r;
    }
  }
  const char* name() const override { return "uring"; }

  // Creates the first ring, so that a kernel without io_uring is found at start-up.
  Status Init() {
    auto r = NewRing();
    if (!r.ok()) return r.status();
    free_.push_back(*r);
    return Status::Ok();
  }

  Status Submit(std::span<IoOp> ops) override {
    auto ring = Acquire();
    if (!ring.ok()) return ring.status();
    Status st = Run(*ring, ops);
    Release(*ring);
    return st;
  }

 private:
  Result<io_uring*> NewRing() {
    auto* r = new io_uring;
    int rc = io_uring_queue_init(depth_, r, 0);
    if (rc < 0) {
      delete r;
      return Status::FromErrno(-rc, "io_uring_queue_init");
    }
    return r;
  }

  Result<io_uring*> Acquire() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        io_uring* r = free_.back();
        free_.pop_back();
        return r;
      }
    }
    return NewRing();
  }

  void Release(io_uring* r) {
    std::lock_guard lock(mu_);
    free_.push_back(r);
  }

  Status Run(io_uring* ring, std::span<IoOp> ops) {
    std::vector<int> zero_writes(ops.size(), 0);
    std::vector<size_t> pending;  // ops with a request still to (re)submit
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].done = 0;
      ops[i].status = Status::Ok();
      if (ops[i].len > 0) pending.push_back(i);
    }
    size_t in_flight = 0;
    while (!pending.empty() || in_flight > 0) {
      // Fill the submission queue with as many pending requests as fit.
      while (!pending.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (!sqe) break;
        size_t i = pending.back();
        pending.pop_back();
        IoOp& op = ops[i];
        char* p = static_cast<char*>(op.buf) + op.done;
        auto n = static_cast<unsigned>(std::min<size_t>(NextLen(op, max_op_bytes_), 1u << 30));
        auto off = static_cast<__u64>(NextOffset(op));
        if (op.kind == IoOp::Kind::kRead) {
          io_uring_prep_read(sqe, op.fd, p, n, off);
        } else {
          io_uring_prep_write(sqe, op.fd, p, n, off);
        }
        io_uring_sqe_set_data64(sqe, i);
        ++in_flight;
      }
      int rc = io_uring_submit_and_wait(ring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
        // The ring itself failed: finish what is in flight, fail the rest.
        for (size_t i : pending) ops[i].status = Status::FromErrno(-rc, "io_uring_submit");
        pending.clear();
        if (in_flight == 0) break;
      }
      io_uring_cqe* cqe;
      while (in_flight > 0 && io_uring_peek_cqe(ring, &cqe) == 0) {
        size_t i = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        --in_flight;
        if (!Advance(ops[i], res, &zero_writes[i])) pending.push_back(i);
      }
    }
    for (IoOp& op : ops) {
      if (!op.status.ok()) return op.status;
    }
    return Status::Ok();
  }

  const unsigned depth_;
  const size_t max_op_bytes_;
  std::mutex mu_;
  std::vector<io_uring*> free_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeIoEngine(const IoEngineOptions& opts) {
  if (opts.kind == "pread") return std::unique_ptr<IoEngine>(new PosixEngine(opts.max_op_bytes));
  if (opts.kind != "uring") return Invalid("unknown io engine '" + opts.kind + "'");
  auto engine = std::make_unique<UringEngine>(opts.queue_depth, opts.max_op_bytes);
  Status st = engine->Init();
  if (!st.ok()) {
    GetLogger("cache")->warn("io_uring unavailable ({}), using pread/pwrite", st.ToString());
    return std::unique_ptr<IoEngine>(new PosixEngine(opts.max_op_bytes));
  }
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace ckptfs
