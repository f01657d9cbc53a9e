#include "store/open_table.h"

namespace ckptfs {

std::shared_ptr<OpenFile> OpenTable::Find(uint64_t ino) {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  return it == files_.end() ? nullptr : it->second;
}

std::shared_ptr<OpenFile> OpenTable::Pin(uint64_t ino) {
  MutexLock lock(&mu_);
  auto& f = files_[ino];
  if (!f) f = std::make_shared<OpenFile>();
  ++f->opens;
  return f;
}

bool OpenTable::Unpin(uint64_t ino) {
  MutexLock lock(&mu_);
  auto it = files_.find(ino);
  if (it == files_.end()) return true;
  if (--it->second->opens > 0) return false;
  files_.erase(it);
  return true;
}

bool OpenTable::IsOpen(uint64_t ino) {
  MutexLock lock(&mu_);
  return files_.count(ino) > 0;
}

std::vector<std::pair<uint64_t, std::shared_ptr<OpenFile>>> OpenTable::All() {
  MutexLock lock(&mu_);
  return {files_.begin(), files_.end()};
}

size_t OpenTable::size() {
  MutexLock lock(&mu_);
  return files_.size();
}

void OpenTable::MarkStale(uint64_t ino) {
  MutexLock lock(&mu_);
  stale_pages_.insert(ino);
}

bool OpenTable::TakeStale(uint64_t ino) {
  MutexLock lock(&mu_);
  return stale_pages_.erase(ino) > 0;
}

}  // namespace ckptfs
