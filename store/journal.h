// The namespace's change journal in the bucket (docs/journal.md): one object per change of
// files/ or dirs/, `journal/<seq>` with seq = 1, 2, 3, ... dense, each number taken by an
// exclusive create (Backend::PutIfAbsent). Nothing depends on clocks: a writer takes the next free
// number, and since numbers are taken atomically and in order, a reader that has read up to n
// finds every later change at n + 1, n + 2, ... with start-after listings, however skewed the
// writers' clocks and however long the reader was away. An entry names the key that changed, not
// how: a reader re-reads that key from the bucket, so entries applied twice, out of date or
// after a later change of the same key all end in the bucket's current state.
//
// An entry is appended after the change it announces is in the bucket. A writer that dies in
// between leaves a change no entry announces; a node that restarts redoes the op (RemoteTier's
// queue), and the mounts' periodic full listing (sync_full_interval) finds the rest.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "common/status.h"

namespace ckptfs {

class NamespaceJournal {
 public:
  static constexpr std::string_view kPrefix = "journal/";

  // `writer`: this node's id, written into its entries (they are told apart by it and a
  // per-process counter, so that a create retried after a lost answer knows its own entry).
  NamespaceJournal(Backend* backend, std::string writer);

  static std::string Key(uint64_t seq);
  // The seq of a journal key; 0 when it is none.
  static uint64_t SeqOf(std::string_view key);

  // Appends "`key` changed". kIo (and the like) when the backend failed: the caller retries the
  // change and its append.
  Status Append(const std::string& key);

  struct Batch {
    std::vector<std::string> keys;  // the changed keys, in journal order (repeats kept)
    uint64_t last = 0;              // the seq of the last entry read (the new cursor)
    bool gap = false;               // entries after the cursor are gone (truncated): relist
  };
  // The entries after `cursor`, at most `max` of them. An entry that cannot be read as one is a
  // gap too (the reader relists rather than guess).
  Result<Batch> ReadAfter(uint64_t cursor, size_t max = 100000);

  // The newest seq (0: the journal is empty), in O(log n) requests: the oldest entry from a
  // one-key listing, then HEADs doubling and bisecting upwards from it.
  Result<uint64_t> Head();

  // Whether the backend refuses a second create of one key (an S3 gateway may ignore
  // If-None-Match): two creates of a probe key. Without exclusive creates the journal cannot be
  // trusted; the caller lists instead.
  Result<bool> CreatesAreExclusive();

  // Deletes the entries older than the newest `keep` (keep >= 1: the newest always stays, so
  // that numbers are never taken twice), but none after `keep_after` (the journal entry of the
  // newest record snapshot: a mount reads the entries after it). Returns how many went.
  Result<uint64_t> Truncate(uint64_t keep, uint64_t keep_after = UINT64_MAX);

 private:
  std::string Body(const std::string& key, uint64_t nonce) const;
  // The last seq listed after `after`, or `after` itself when none is.
  Result<uint64_t> LastAfter(uint64_t after);

  Backend* const backend_;
  const std::string writer_;
  const uint64_t instance_;  // random per process: nonces of restarted processes differ
  std::atomic<uint64_t> next_nonce_{0};
  std::mutex mu_;
  uint64_t head_hint_ = 0;  // guarded by mu_: a seq known taken (appends start after it)
};

}  // namespace ckptfs
