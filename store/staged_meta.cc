#include "store/staged_meta.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

namespace ckptfs {

std::string StagePath(const std::string& cache_dir, const std::string& name) {
  return cache_dir + "/passthrough/" + name;
}

Status OverlayStaged(MetaStore::Txn& txn, InodeRecord* rec) {
  if (!S_ISREG(rec->mode)) return Status::Ok();
  ASSIGN_OR_RETURN(auto staged, txn.GetStaged(rec->ino));
  if (!staged) return Status::Ok();
  rec->size = staged->size;
  rec->data_bytes = staged->data_bytes;
  rec->mtime_ns = rec->ctime_ns = staged->mtime_ns;
  return Status::Ok();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string CurrentBootId() {
  if (const char* forced = std::getenv("CKPTFS_BOOT_ID"); forced && *forced) return forced;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

int64_t MtimeNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

uint64_t DataBytes(const struct stat& st) {
  return std::min<uint64_t>(static_cast<uint64_t>(st.st_blocks) * 512,
                            static_cast<uint64_t>(st.st_size));
}

}  // namespace ckptfs
