// Which checkpoints retention keeps, on every layout ckptfs recognizes (store/retention.h).
#include "store/retention.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckptfs {
namespace {

// "name:keep-reason" for each checkpoint, oldest first ("name:" when it may go).
std::vector<std::string> Decide(const std::vector<CheckpointDir>& dirs, RetentionPolicy p,
                                Trackers t = {}) {
  std::vector<std::string> out;
  for (const RetentionDecision& d : DecideRetention(dirs, t, p)) out.push_back(d.name + ":" + d.keep);
  return out;
}

TEST(RetentionTest, MegatronIterationsByStepWithTheTrackerAndEveryKth) {
  // Listed out of order; "release" and a stray directory are not iterations.
  std::vector<CheckpointDir> dirs = {{"iter_0000300"}, {"iter_0000100"}, {"iter_0001000"},
                                     {"iter_0000200"}, {"iter_0000400"}, {"logs"}};
  EXPECT_EQ(Decide(dirs, {1, 0}, Trackers{"200", "", ""}),
            (std::vector<std::string>{"iter_0000100:", "iter_0000200:named by a tracker file",
                                      "iter_0000300:", "iter_0000400:",
                                      "iter_0001000:newest 1"}));
  EXPECT_EQ(Decide(dirs, {2, 200}),
            (std::vector<std::string>{"iter_0000100:", "iter_0000200:every 200",
                                      "iter_0000300:", "iter_0000400:newest 2",
                                      "iter_0001000:newest 2"}));
}

TEST(RetentionTest, DeepSpeedGlobalStepsWithTheLatestTags) {
  std::vector<CheckpointDir> dirs = {{"global_step9"}, {"global_step10"}, {"global_step8"},
                                     {"global_step11"}};
  EXPECT_EQ(Decide(dirs, {1, 0}, Trackers{"", "global_step8", "global_step9"}),
            (std::vector<std::string>{"global_step8:named by a tracker file",
                                      "global_step9:named by a tracker file",
                                      "global_step10:", "global_step11:newest 1"}));
}

TEST(RetentionTest, DcpStepDirectoriesAreThoseWithMetadata) {
  std::vector<CheckpointDir> dirs = {{"step_20", true}, {"step_3", true}, {"step_100", true},
                                     {"notes_999", false}};
  EXPECT_EQ(Decide(dirs, {2, 0}),
            (std::vector<std::string>{"step_3:", "step_20:newest 2", "step_100:newest 2"}));
}

TEST(RetentionTest, PlainDirectoriesGoByTimeWhereNoLayoutIsRecognized) {
  std::vector<CheckpointDir> dirs = {{"b", false, 300}, {"a", false, 100}, {"c", false, 200}};
  EXPECT_EQ(Decide(dirs, {1, 0}), (std::vector<std::string>{"a:", "c:", "b:newest 1"}));
  EXPECT_EQ(Decide(dirs, {5, 0}),
            (std::vector<std::string>{"a:newest 5", "c:newest 5", "b:newest 5"}));
  EXPECT_TRUE(Decide({}, {1, 0}).empty());
}

TEST(RetentionTest, RetainXattrNamesKeepLastAndOptionallyKeepEvery) {
  auto p = ParseRetainXattr("keep_last=3,keep_every=100");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->keep_last, 3u);
  EXPECT_EQ(p->keep_every, 100u);
  p = ParseRetainXattr("keep_every=2 keep_last=1");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->keep_last, 1u);
  EXPECT_EQ(p->keep_every, 2u);
  for (const char* bad : {"", "keep_last=0", "keep_every=5", "keep_last", "keep_last=-1",
                          "keep_last=2,keep_first=1"}) {
    EXPECT_EQ(ParseRetainXattr(bad).status().code(), Code::kInvalid) << bad;
  }
}

}  // namespace
}  // namespace ckptfs
