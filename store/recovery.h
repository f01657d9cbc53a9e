// Recovery at open: what a store does with its cache directory before it serves. The spills of
// a daemon that died are dropped; in one write transaction under the namespace lock the
// namespace removes the files unlinked while open and those created and never kept
// (Namespace::Recover), the fallbacks put back the files whose newest version a machine crash
// may have lost (Fallbacks::Recover), and the staged records whose staging files did not
// survive are dropped (Staging::RecoverStaged); the chunks freed go once that is durable. After
// an unclean stop the chunks no record names (written for commits that never happened) go too.
#pragma once

#include <string>

#include "common/log.h"
#include "common/status.h"

namespace ckptfs {

class CacheDir;
class ChunkCache;
class MetaStore;
class Namespace;
class Staging;

struct RecoveryParts {
  const std::string& cache_dir;
  const CacheDir& dir;
  MetaStore& meta;
  ChunkCache& cache;
  Namespace& ns;
  Staging& staging;
  const Logger& log;
};

// `clean`: the last daemon stopped cleanly (CacheDir::clean). REQUIRES: no request served yet,
// the namespace lock not held.
Status RecoverAtOpen(const RecoveryParts& p, bool clean);

}  // namespace ckptfs
