// PutFlights (store/put_flights.h): overlapping puts of one chunk share one write.
#include "store/put_flights.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckptfs {
namespace {

ChunkId IdOf(const std::string& s) {
  return ChunkId::Of(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(PutFlightsTest, APutOfAChunkInFlightJoinsItAndEndsWithItsOutcome) {
  PutFlights flights;
  const ChunkId a = IdOf("a"), b = IdOf("b");
  std::vector<std::string> ran;
  PutFlights::Done first = [&](Status) { ran.push_back("first"); };
  EXPECT_FALSE(flights.Join(a, 10, first)) << "the first put of a chunk begins a flight";
  ASSERT_TRUE(first) << "a put that begins a flight keeps its own callback";
  PutFlights::Done other = [&](Status) { ran.push_back("b"); };
  EXPECT_FALSE(flights.Join(b, 20, other)) << "another chunk has a flight of its own";
  PutFlights::Done second = [&](Status st) { ran.push_back("second:" + st.ToString()); };
  EXPECT_TRUE(flights.Join(a, 10, second));
  EXPECT_FALSE(second) << "the joined callback moved into the flight";
  EXPECT_EQ(flights.size(), 2u);

  std::vector<PutFlights::Joined> joined = flights.End(a);
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_EQ(joined[0].len, 10u);
  joined[0].done(Status(Code::kNoSpace, "full"));
  EXPECT_EQ(ran, std::vector<std::string>{"second:" + Status(Code::kNoSpace, "full").ToString()});
  EXPECT_EQ(flights.size(), 1u);

  // Once ended, the next put of the chunk begins a new flight.
  PutFlights::Done third = [](Status) {};
  EXPECT_FALSE(flights.Join(a, 10, third));
  EXPECT_TRUE(flights.End(a).empty());
  EXPECT_TRUE(flights.End(b).empty());
  EXPECT_EQ(flights.size(), 0u);
}

TEST(PutFlightsTest, APutMaySkipOnlyWhenNoOtherPutWaitsOnIt) {
  PutFlights flights;
  const ChunkId a = IdOf("a");
  PutFlights::Done mine = [](Status) {};
  ASSERT_FALSE(flights.Join(a, 1, mine));
  EXPECT_TRUE(flights.EndIfAlone(a)) << "nobody joined: the put is skipped and the flight ends";
  EXPECT_EQ(flights.size(), 0u);
  EXPECT_FALSE(flights.EndIfAlone(a)) << "no flight left to end";

  ASSERT_FALSE(flights.Join(a, 1, mine));
  PutFlights::Done theirs = [](Status) {};
  ASSERT_TRUE(flights.Join(a, 1, theirs));
  EXPECT_FALSE(flights.EndIfAlone(a)) << "another cut waits on this put: it is written after all";
  EXPECT_EQ(flights.size(), 1u);
  EXPECT_EQ(flights.End(a).size(), 1u);
}

}  // namespace
}  // namespace ckptfs
