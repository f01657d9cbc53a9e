// PutFlights (store/put_flights.h): overlapping puts of one chunk share one write.
#include "store/put_flights.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

namespace ckptfs {
namespace {

ChunkId IdOf(const std::string& s) {
  return ChunkId::Of(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// What each joined put was done with, through a `stored` that passes the outcome on as a status
// (ok for a chunk found stored, which is what the store's Stored answers).
struct Record {
  std::vector<std::string> seen;  // "len:outcome" as `stored` saw them
  std::vector<Status> done;       // what the callbacks got
  PutFlights::Stored stored() {
    return [this](size_t len, const Result<bool>& r) {
      seen.push_back(std::to_string(len) + ":" +
                     (r.ok() ? (*r ? "written" : "found") : r.status().ToString()));
      return r.ok() ? Status::Ok() : r.status();
    };
  }
  PutFlights::Done callback() {
    return [this](Status st) { done.push_back(std::move(st)); };
  }
};

TEST(PutFlightsTest, PutsThatJoinAFlightEndWithItsOutcome) {
  PutFlights flights;
  Record rec;
  const ChunkId a = IdOf("a"), b = IdOf("b");
  PutFlights::Done owner = rec.callback();
  EXPECT_FALSE(flights.Join(a, 10, nullptr, owner)) << "the first put of a chunk begins a flight";
  ASSERT_TRUE(owner) << "a put that begins a flight keeps its own callback";
  PutFlights::Done other = rec.callback();
  EXPECT_FALSE(flights.Join(b, 20, nullptr, other)) << "another chunk has a flight of its own";
  for (size_t len : {10u, 11u}) {
    PutFlights::Done joiner = rec.callback();
    EXPECT_TRUE(flights.Join(a, len, nullptr, joiner));
    EXPECT_FALSE(joiner) << "the joined callback moved into the flight";
  }
  EXPECT_EQ(flights.size(), 2u);

  // The owner wrote the chunk: those that joined find it stored.
  flights.End(a, true, rec.stored());
  EXPECT_EQ(rec.seen, (std::vector<std::string>{"10:found", "11:found"}));
  ASSERT_EQ(rec.done.size(), 2u);
  EXPECT_TRUE(rec.done[0].ok() && rec.done[1].ok());
  EXPECT_EQ(flights.size(), 1u);

  // Once ended, the next put of the chunk begins a new flight; a failed write fails its joiner.
  PutFlights::Done again = rec.callback(), joiner = rec.callback();
  EXPECT_FALSE(flights.Join(a, 10, nullptr, again));
  EXPECT_TRUE(flights.Join(a, 12, nullptr, joiner));
  const Status full(Code::kNoSpace, "full");
  flights.End(a, full, rec.stored());
  ASSERT_EQ(rec.done.size(), 3u);
  EXPECT_EQ(rec.done[2].code(), Code::kNoSpace) << "a joiner is never told a failed chunk is stored";
  EXPECT_EQ(rec.seen.back(), "12:" + full.ToString());

  flights.End(b, false, rec.stored());
  EXPECT_EQ(rec.done.size(), 3u) << "nobody joined b";
  EXPECT_EQ(flights.size(), 0u);
}

TEST(PutFlightsTest, AGivenUpPutIsSkippedOnlyWhenEveryPutWaitingOnItWasGivenUpToo) {
  PutFlights flights;
  Record rec;
  const ChunkId a = IdOf("a");
  const Status why(Code::kIo, "cancelled");
  PutFlights::Done owner = rec.callback();
  ASSERT_FALSE(flights.Join(a, 1, nullptr, owner));
  EXPECT_TRUE(flights.EndIfUnwanted(a, why, rec.stored())) << "nobody joined: skipped";
  EXPECT_EQ(flights.size(), 0u);

  ASSERT_FALSE(flights.Join(a, 1, nullptr, owner));
  std::atomic<bool> given_up{true}, going_on{false};
  PutFlights::Done first = rec.callback(), second = rec.callback();
  ASSERT_TRUE(flights.Join(a, 2, &given_up, first));
  ASSERT_TRUE(flights.Join(a, 3, &going_on, second));
  EXPECT_FALSE(flights.EndIfUnwanted(a, why, rec.stored()))
      << "a cut still going waits on this put: it is written after all";
  EXPECT_TRUE(rec.done.empty());
  EXPECT_EQ(flights.size(), 1u);

  going_on = true;
  EXPECT_TRUE(flights.EndIfUnwanted(a, why, rec.stored()));
  ASSERT_EQ(rec.done.size(), 2u);
  EXPECT_EQ(rec.done[0].code(), Code::kIo);
  EXPECT_EQ(rec.done[1].code(), Code::kIo);
  EXPECT_EQ(flights.size(), 0u);

  // A put that cannot be given up (no flag) always keeps the flight wanted.
  ASSERT_FALSE(flights.Join(a, 1, nullptr, owner));
  PutFlights::Done plain = rec.callback();
  ASSERT_TRUE(flights.Join(a, 4, nullptr, plain));
  EXPECT_FALSE(flights.EndIfUnwanted(a, why, rec.stored()));
  flights.End(a, false, rec.stored());
  EXPECT_EQ(rec.done.size(), 3u);
  EXPECT_TRUE(rec.done[2].ok());
}

}  // namespace
}  // namespace ckptfs
