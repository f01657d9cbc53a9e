// Native DeepSpeed MoE checkpoints: which files of a tag the views take as MoE's. The dpD view
// itself is checked through a mount against tests/reshard/deepspeed_moe_fixture.py's reference
// (tests/integration/test_views_deepspeed_moe.py).
#include <gtest/gtest.h>

#include "reshard/deepspeed.h"

namespace ckptfs::reshard {
namespace {

TEST(DeepSpeedMoe, FileNames) {
  EXPECT_TRUE(IsDeepSpeedMoeName("layer_0_expert_3_mp_rank_00_model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedMoeName("layer_11_expert_127_mp_rank_02_model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedMoeName("expert_5_mp_rank_00_model_states.pt"));  // before layer ids
  EXPECT_TRUE(IsDeepSpeedMoeName("expp_rank_1_mp_rank_00_optim_states.pt"));
  for (const char* bad :
       {"layer_0_expert_3_mp_rank_0_model_states.pt", "layer_00_expert_3_mp_rank_00_model_states.pt",
        "layer_01-model_00-model_states.pt", "expp_rank_1_mp_rank_00_optim.pt",
        "mp_rank_00_model_states.pt", "layer_0_expert_3_mp_rank_00_model_states.ptx"}) {
    EXPECT_FALSE(IsDeepSpeedMoeName(bad)) << bad;
  }
  // An expert file is no pipeline layer file (both start with layer_), and the expp_rank files
  // are no ZeRO optimizer files.
  EXPECT_FALSE(IsDeepSpeedLayerName("layer_0_expert_3_mp_rank_00_model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("layer_0_expert_3_mp_rank_00_model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("expp_rank_0_mp_rank_00_optim_states.pt"));
}

}  // namespace
}  // namespace ckptfs::reshard
