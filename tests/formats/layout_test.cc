// Listings here follow the names the frameworks' save code produces; each test cites the function.
#include "formats/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>

namespace ckptfs::layout {
namespace {

// Files by path; a path ending in '/' is an (empty) directory. `contents` fills tracker files.
std::vector<Entry> Listing(const std::vector<std::string>& paths,
                           const std::map<std::string, std::string>& contents = {}) {
  std::vector<Entry> out;
  for (const std::string& p : paths) {
    Entry e;
    e.is_dir = !p.empty() && p.back() == '/';
    e.path = e.is_dir ? p.substr(0, p.size() - 1) : p;
    if (auto it = contents.find(e.path); it != contents.end()) e.content = it->second;
    out.push_back(std::move(e));
  }
  return out;
}

Layout MustDetect(const std::vector<Entry>& listing) {
  auto r = Detect(listing);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Layout();
}

bool HasProblem(const Layout& l, std::string_view path, std::string_view text) {
  for (const Problem& p : l.problems) {
    if (p.path == path && p.message.find(text) != std::string::npos) return true;
  }
  return false;
}

// Megatron-LM iteration: get_checkpoint_name() gives iter_{:07d}/mp_rank_{tp:02d}[_{pp:03d}]
// [_{ep:03d}]/model_optim_rng.pt; `with_optim` adds get_distributed_optimizer_checkpoint_name()'s
// distrib_optim.pt beside it.
std::vector<std::string> MegatronIter(const std::string& dir, int tp, int pp, int ep,
                                      bool pp_in_name, bool ep_in_name, bool with_optim = false) {
  std::vector<std::string> out;
  char buf[64];
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      for (int e = 0; e < ep; ++e) {
        std::string name = (std::snprintf(buf, sizeof(buf), "mp_rank_%02d", t), buf);
        if (pp_in_name) name += (std::snprintf(buf, sizeof(buf), "_%03d", p), buf);
        if (ep_in_name) name += (std::snprintf(buf, sizeof(buf), "_%03d", e), buf);
        out.push_back(dir + "/" + name + "/model_optim_rng.pt");
        if (with_optim) out.push_back(dir + "/" + name + "/distrib_optim.pt");
      }
    }
  }
  return out;
}

std::vector<std::string> Concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(LayoutTest, MegatronTensorParallelWithTracker) {
  // The tracker is get_checkpoint_tracker_filename(); save_checkpoint writes str(iteration).
  auto listing = Listing(Concat({MegatronIter("iter_0000100", 2, 1, 1, false, false),
                                 MegatronIter("iter_0000200", 2, 1, 1, false, false),
                                 {"latest_checkpointed_iteration.txt"}}),
                         {{"latest_checkpointed_iteration.txt", "200"}});
  Layout l = MustDetect(listing);
  EXPECT_EQ(l.kind, Kind::kMegatron);
  ASSERT_TRUE(l.megatron);
  EXPECT_TRUE(l.megatron->has_tracker);
  EXPECT_EQ(l.megatron->tracker, "200");
  EXPECT_EQ(l.megatron->tracker_iteration, 200);
  ASSERT_EQ(l.megatron->iterations.size(), 2u);
  const MegatronIteration& it = l.megatron->iterations[1];
  EXPECT_EQ(it.dir, "iter_0000200");
  EXPECT_EQ(it.iteration, 200);
  EXPECT_EQ(it.naming, RankNaming::kTp);
  EXPECT_EQ(it.tp, 2u);
  EXPECT_EQ(it.pp, 1u);
  EXPECT_EQ(it.ep, 1u);
  EXPECT_TRUE(it.complete);
  EXPECT_FALSE(it.distrib_optim);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);
  EXPECT_FALSE(l.deepspeed);
}

TEST(LayoutTest, MegatronPipelineAndDistributedOptimizer) {
  Layout l = MustDetect(Listing(MegatronIter("iter_0001000", 4, 2, 1, true, false, true)));
  ASSERT_TRUE(l.megatron);
  EXPECT_FALSE(l.megatron->has_tracker);
  ASSERT_EQ(l.megatron->iterations.size(), 1u);
  const MegatronIteration& it = l.megatron->iterations[0];
  EXPECT_EQ(it.naming, RankNaming::kTpX);  // mp_rank_TT_PPP: PP, or EP without PP
  EXPECT_EQ(it.tp, 4u);
  EXPECT_EQ(it.pp, 2u);
  EXPECT_TRUE(it.distrib_optim);
  EXPECT_TRUE(it.complete);
}

TEST(LayoutTest, MegatronExpertParallel) {
  Layout l = MustDetect(Listing(MegatronIter("iter_0000010", 2, 2, 4, true, true)));
  const MegatronIteration& it = l.megatron->iterations[0];
  EXPECT_EQ(it.naming, RankNaming::kTpPpEp);
  EXPECT_EQ(it.tp, 2u);
  EXPECT_EQ(it.pp, 2u);
  EXPECT_EQ(it.ep, 4u);
  EXPECT_TRUE(it.complete);
}

TEST(LayoutTest, MegatronIncompleteGridIsReported) {
  auto paths = MegatronIter("iter_0000100", 2, 2, 1, true, false);
  paths.erase(
      std::remove(paths.begin(), paths.end(), "iter_0000100/mp_rank_01_001/model_optim_rng.pt"),
      paths.end());
  paths.push_back("iter_0000100/mp_rank_00_001/");  // an empty rank directory is no better
  paths.erase(
      std::remove(paths.begin(), paths.end(), "iter_0000100/mp_rank_00_001/model_optim_rng.pt"),
      paths.end());
  Layout l = MustDetect(Listing(paths));
  const MegatronIteration& it = l.megatron->iterations[0];
  EXPECT_EQ(it.tp, 2u);
  EXPECT_EQ(it.pp, 2u);
  EXPECT_FALSE(it.complete);
  EXPECT_TRUE(HasProblem(l, "iter_0000100/mp_rank_01_001", "missing from the rank grid"))
      << Describe(l);
  EXPECT_TRUE(HasProblem(l, "iter_0000100/mp_rank_00_001", "no model_optim_rng.pt"));
  EXPECT_TRUE(HasProblem(l, "iter_0000100", "2 of 4 ranks"));
}

TEST(LayoutTest, MegatronMixedNamingIsReported) {
  auto paths = Concat({MegatronIter("iter_0000100", 2, 1, 1, false, false),
                       {"iter_0000100/mp_rank_00_000/model_optim_rng.pt"}});
  Layout l = MustDetect(Listing(paths));
  EXPECT_EQ(l.megatron->iterations[0].naming, RankNaming::kMixed);
  EXPECT_FALSE(l.megatron->iterations[0].complete);
  EXPECT_TRUE(HasProblem(l, "iter_0000100", "more than one scheme"));
}

TEST(LayoutTest, MegatronReleaseAndTrackerChecks) {
  // read_metadata(): "release" marks a release checkpoint in directory "release".
  Layout rel = MustDetect(Listing(Concat({MegatronIter("release", 1, 1, 1, false, false),
                                          {"latest_checkpointed_iteration.txt"}}),
                                  {{"latest_checkpointed_iteration.txt", "release\n"}}));
  ASSERT_TRUE(rel.megatron);
  EXPECT_TRUE(rel.megatron->tracker_release);
  ASSERT_EQ(rel.megatron->iterations.size(), 1u);
  EXPECT_TRUE(rel.megatron->iterations[0].release);
  EXPECT_EQ(rel.megatron->iterations[0].iteration, -1);
  EXPECT_TRUE(rel.problems.empty()) << Describe(rel);

  auto base = Concat(
      {MegatronIter("iter_0000100", 1, 1, 1, false, false), {"latest_checkpointed_iteration.txt"}});
  Layout missing = MustDetect(Listing(base, {{"latest_checkpointed_iteration.txt", " 300 \n"}}));
  EXPECT_EQ(missing.megatron->tracker_iteration, 300);
  EXPECT_TRUE(HasProblem(missing, "latest_checkpointed_iteration.txt", "iter_0000300"));
  Layout garbage = MustDetect(Listing(base, {{"latest_checkpointed_iteration.txt", "latest"}}));
  EXPECT_TRUE(HasProblem(garbage, "latest_checkpointed_iteration.txt", "neither"));
  Layout negative = MustDetect(Listing(base, {{"latest_checkpointed_iteration.txt", "-1"}}));
  EXPECT_TRUE(HasProblem(negative, "latest_checkpointed_iteration.txt", "negative"));
  // Without the content nothing is checked; the tracker alone still marks Megatron.
  Layout unread = MustDetect(Listing({"latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(unread.kind, Kind::kMegatron);
  EXPECT_TRUE(unread.megatron->has_tracker);
  EXPECT_FALSE(unread.megatron->tracker);
  EXPECT_TRUE(unread.problems.empty());
}

TEST(LayoutTest, MegatronIterationNamesFollowTheFormat) {
  // '{:07d}' pads to 7 digits and no more: iter_12345678 is iteration 12345678; iter_00000100
  // and iter_100 are not Megatron's names.
  Layout l = MustDetect(Listing(Concat({MegatronIter("iter_12345678", 1, 1, 1, false, false),
                                        MegatronIter("iter_00000100", 1, 1, 1, false, false),
                                        MegatronIter("iter_100", 1, 1, 1, false, false),
                                        {"iter_0000005/notes.txt"}})));
  ASSERT_EQ(l.megatron->iterations.size(), 1u);
  EXPECT_EQ(l.megatron->iterations[0].iteration, 12345678);
  // mp_rank_0 (one digit) is not '{:02d}'.
  Layout bad = MustDetect(Listing({"iter_0000001/mp_rank_0/model_optim_rng.pt"}));
  EXPECT_EQ(bad.kind, Kind::kUnknown);
}

TEST(LayoutTest, MegatronDistCheckpointIteration) {
  // dist_checkpointing writes metadata.json (CONFIG_FNAME) and, with the torch_dist backend, a
  // DCP directory: .metadata and __R_N.distcp (plus common.pt).
  Layout l = MustDetect(Listing({"iter_0000050/metadata.json", "iter_0000050/common.pt",
                                 "iter_0000050/.metadata", "iter_0000050/__0_0.distcp",
                                 "iter_0000050/__1_0.distcp", "latest_checkpointed_iteration.txt"},
                                {{"latest_checkpointed_iteration.txt", "50"}}));
  EXPECT_EQ(l.kind, Kind::kMegatron);
  ASSERT_EQ(l.megatron->iterations.size(), 1u);
  EXPECT_TRUE(l.megatron->iterations[0].dist_checkpoint);
  EXPECT_TRUE(l.megatron->iterations[0].complete);
  EXPECT_EQ(l.megatron->iterations[0].naming, RankNaming::kNone);
  ASSERT_EQ(l.dcp.size(), 1u);
  EXPECT_EQ(l.dcp[0].dir, "iter_0000050");
  EXPECT_EQ(l.dcp[0].ranks, 2u);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);
}

// DeepSpeed ZeRO-1/2 with bf16: _get_ckpt_name() "mp_rank_{:02d}_model_states.pt",
// _get_rank_zero_ckpt_name() "bf16_zero_pp_rank_{dp}_mp_rank_{:02d}_optim_states.pt",
// save_checkpoint() tag "global_step{N}" and the `latest` file; _copy_recovery_script() puts
// zero_to_fp32.py in the save directory.
std::vector<std::string> DeepSpeedTagFiles(const std::string& tag, int mp, int dp, bool bf16) {
  std::vector<std::string> out;
  char buf[128];
  for (int m = 0; m < mp; ++m) {
    std::snprintf(buf, sizeof(buf), "%s/mp_rank_%02d_model_states.pt", tag.c_str(), m);
    out.push_back(buf);
    for (int d = 0; d < dp; ++d) {
      std::snprintf(buf, sizeof(buf), "%s/%szero_pp_rank_%d_mp_rank_%02d_optim_states.pt",
                    tag.c_str(), bf16 ? "bf16_" : "", d, m);
      out.push_back(buf);
    }
  }
  return out;
}

TEST(LayoutTest, DeepSpeedZero2Bf16) {
  auto listing = Listing(Concat({DeepSpeedTagFiles("global_step1000", 2, 4, true),
                                 DeepSpeedTagFiles("global_step500", 2, 4, true),
                                 {"latest", "zero_to_fp32.py"}}),
                         {{"latest", "global_step1000"}});
  Layout l = MustDetect(listing);
  EXPECT_EQ(l.kind, Kind::kDeepSpeed);
  ASSERT_TRUE(l.deepspeed);
  EXPECT_EQ(l.deepspeed->latest, "global_step1000");
  ASSERT_EQ(l.deepspeed->tags.size(), 2u);
  EXPECT_EQ(l.deepspeed->tags[0].tag, "global_step500");  // by step, not by name
  const DeepSpeedTag& t = l.deepspeed->tags[1];
  EXPECT_EQ(t.global_step, 1000);
  EXPECT_EQ(t.mp_size, 2u);
  EXPECT_EQ(t.dp_size, 4u);
  EXPECT_EQ(t.zero, ZeroStage::kOneOrTwo);
  EXPECT_TRUE(t.bf16);
  EXPECT_TRUE(t.complete);
  EXPECT_FALSE(t.universal);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);
  EXPECT_FALSE(l.megatron);
}

TEST(LayoutTest, DeepSpeedMissingPartitionAndStaleLatest) {
  auto paths = DeepSpeedTagFiles("global_step7", 1, 3, false);
  paths.erase(std::remove(paths.begin(), paths.end(),
                          "global_step7/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
              paths.end());
  paths.push_back("latest");
  Layout l = MustDetect(Listing(paths, {{"latest", "global_step8"}}));
  const DeepSpeedTag& t = l.deepspeed->tags[0];
  EXPECT_FALSE(t.bf16);
  EXPECT_EQ(t.dp_size, 3u);
  EXPECT_FALSE(t.complete);
  EXPECT_TRUE(HasProblem(l, "global_step7", "dp rank 1, mp rank 0 missing")) << Describe(l);
  EXPECT_TRUE(HasProblem(l, "latest", "global_step8"));
}

TEST(LayoutTest, DeepSpeedLegacyOptimizerNameAndCustomTag) {
  // _get_all_zero_checkpoint_names() still loads "..._mp_rank_00optim_states.pt".
  Layout l = MustDetect(Listing({"my_tag/mp_rank_00_model_states.pt",
                                 "my_tag/zero_pp_rank_0_mp_rank_00optim_states.pt",
                                 "my_tag/zero_pp_rank_1_mp_rank_00optim_states.pt"}));
  ASSERT_TRUE(l.deepspeed);
  const DeepSpeedTag& t = l.deepspeed->tags[0];
  EXPECT_FALSE(t.global_step);
  EXPECT_EQ(t.dp_size, 2u);
  EXPECT_TRUE(t.complete);
}

TEST(LayoutTest, DeepSpeedZero3) {
  // With partitioned weights _get_ckpt_name() gives zero_pp_rank_{dp}_mp_rank_{:02d}_model_states.
  Layout l = MustDetect(Listing({"global_step3/zero_pp_rank_0_mp_rank_00_model_states.pt",
                                 "global_step3/zero_pp_rank_1_mp_rank_00_model_states.pt",
                                 "global_step3/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                 "global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt"}));
  const DeepSpeedTag& t = l.deepspeed->tags[0];
  EXPECT_EQ(t.zero, ZeroStage::kThree);
  EXPECT_EQ(t.dp_size, 2u);
  EXPECT_EQ(t.mp_size, 1u);
  EXPECT_TRUE(t.complete);
}

TEST(LayoutTest, MegatronDeepSpeedPipeline) {
  // Megatron-DeepSpeed with PP=2, TP=2, DP=2 under DeepSpeed's pipeline engine: ckpt_layer_path()
  // writes layer_{idx:02d}-model_{tp:02d}-model_states.pt (layers 00, 02 and 03 here, as layers
  // without parameters are skipped), _get_ckpt_name() one mp_rank file per pipe x model rank, the
  // ZeRO files per (dp, mp); Megatron's save_checkpoint() also writes its tracker.
  std::vector<std::string> paths = DeepSpeedTagFiles("global_step20", 4, 2, true);
  for (const char* layer : {"00", "02", "03"}) {
    for (const char* tp : {"00", "01"}) {
      paths.push_back(std::string("global_step20/layer_") + layer + "-model_" + tp +
                      "-model_states.pt");
    }
  }
  paths.push_back("latest");
  paths.push_back("latest_checkpointed_iteration.txt");
  Layout l = MustDetect(
      Listing(paths, {{"latest", "global_step20"}, {"latest_checkpointed_iteration.txt", "20"}}));
  EXPECT_EQ(l.kind, Kind::kDeepSpeed);
  EXPECT_FALSE(l.megatron);  // the tracker belongs to the DeepSpeed layout here
  EXPECT_TRUE(l.deepspeed->has_megatron_tracker);
  EXPECT_EQ(l.deepspeed->megatron_tracker, "20");
  const DeepSpeedTag& t = l.deepspeed->tags[0];
  EXPECT_EQ(t.mp_size, 4u);
  EXPECT_EQ(t.dp_size, 2u);
  EXPECT_EQ(t.pipeline_layers, 3u);
  EXPECT_EQ(t.layer_tp_size, 2u);
  EXPECT_TRUE(t.complete);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);

  // Without a model axis the rank part is left out: layer_01-model_states.pt.
  Layout plain = MustDetect(Listing(
      {"global_step1/layer_01-model_states.pt", "global_step1/mp_rank_00_model_states.pt"}));
  EXPECT_EQ(plain.deepspeed->tags[0].pipeline_layers, 1u);
  EXPECT_EQ(plain.deepspeed->tags[0].layer_tp_size, 1u);
  // A layer missing one model rank is reported.
  paths.erase(
      std::remove(paths.begin(), paths.end(), "global_step20/layer_02-model_01-model_states.pt"),
      paths.end());
  Layout gap = MustDetect(Listing(paths));
  EXPECT_FALSE(gap.deepspeed->tags[0].complete);
  EXPECT_TRUE(HasProblem(gap, "global_step20", "layer 02 lacks"));
}

TEST(LayoutTest, DeepSpeedMoeAndUniversal) {
  // _get_expert_ckpt_name() and _get_optimizer_ckpt_name() for MoE; ds_to_universal writes
  // <output>/zero/<param>/... beside copies of the mp_rank files and names it in latest_universal.
  Layout l =
      MustDetect(Listing({"global_step9/mp_rank_00_model_states.pt",
                          "global_step9/layer_0_expert_0_mp_rank_00_model_states.pt",
                          "global_step9/layer_0_expert_1_mp_rank_00_model_states.pt",
                          "global_step9/expp_rank_0_mp_rank_00_optim_states.pt",
                          "global_step9_universal/mp_rank_00_model_states.pt",
                          "global_step9_universal/zero/embed.weight/fp32.pt",
                          "global_step9_universal/zero/optimizer_state.pt", "latest_universal"},
                         {{"latest_universal", "global_step9_universal"}}));
  ASSERT_EQ(l.deepspeed->tags.size(), 2u);
  EXPECT_EQ(l.deepspeed->tags[0].tag, "global_step9");
  EXPECT_EQ(l.deepspeed->tags[0].expert_files, 2u);
  EXPECT_EQ(l.deepspeed->tags[0].expert_optim_files, 1u);
  EXPECT_FALSE(l.deepspeed->tags[1].global_step);  // "global_step9_universal" is not the pattern
  EXPECT_TRUE(l.deepspeed->tags[1].universal);
  EXPECT_EQ(l.deepspeed->latest_universal, "global_step9_universal");
  EXPECT_FALSE(l.deepspeed->has_latest);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);
}

TEST(LayoutTest, DcpCheckpoint) {
  // _FileSystemWriter: prepare_global_plan() prefixes "__{i}_", gen_file() numbers per rank and
  // appends ".distcp"; finish() writes .metadata.tmp and renames it to .metadata.
  Layout l = MustDetect(Listing({".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp",
                                 "__3_0.distcp", "__3_1.distcp"}));
  EXPECT_EQ(l.kind, Kind::kDcp);
  ASSERT_EQ(l.dcp.size(), 1u);
  EXPECT_EQ(l.dcp[0].dir, "");
  EXPECT_EQ(l.dcp[0].ranks, 4u);
  EXPECT_EQ(l.dcp[0].files, 5u);
  EXPECT_TRUE(l.dcp[0].complete);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);

  Layout unfinished = MustDetect(Listing({".metadata.tmp", "__0_0.distcp", "__2_0.distcp"}));
  EXPECT_FALSE(unfinished.dcp[0].complete);
  EXPECT_TRUE(HasProblem(unfinished, "", "no .metadata"));
  EXPECT_TRUE(HasProblem(unfinished, ".metadata.tmp", "in flight"));
  EXPECT_TRUE(HasProblem(unfinished, "", "ranks are not 0..1"));

  // Checkpoints in step directories are each described.
  Layout steps = MustDetect(Listing(
      {"step-10/.metadata", "step-10/__0_0.distcp", "step-20/.metadata", "step-20/__0_0.distcp"}));
  EXPECT_EQ(steps.kind, Kind::kDcp);
  ASSERT_EQ(steps.dcp.size(), 2u);
  EXPECT_EQ(steps.dcp[1].dir, "step-20");
}

TEST(LayoutTest, HfShardedSafetensors) {
  // huggingface_hub split_state_dict_into_shards_factory(): "model{suffix}.safetensors" with
  // suffix "-{i:05d}-of-{n:05d}"; transformers writes model.safetensors.index.json beside them.
  const std::string index = R"({"metadata": {"total_size": 1234},
    "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                   "b.weight": "model-00002-of-00002.safetensors",
                   "c.bias": "model-00002-of-00002.safetensors"}})";
  auto paths = std::vector<std::string>{"model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors",
                                        "model.safetensors.index.json", "config.json"};
  Layout l = MustDetect(Listing(paths, {{"model.safetensors.index.json", index}}));
  EXPECT_EQ(l.kind, Kind::kHfSafetensors);
  ASSERT_EQ(l.hf.size(), 1u);
  const HfModel& m = l.hf[0];
  EXPECT_EQ(m.prefix, "model");
  EXPECT_EQ(m.shard_count, 2u);
  EXPECT_EQ(m.shards, (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(m.index_total_size, 1234u);
  EXPECT_EQ(m.index_tensors, 3u);
  EXPECT_TRUE(m.complete);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);

  // A missing shard is reported both from the names and from the index.
  paths.erase(paths.begin() + 1);
  Layout missing = MustDetect(Listing(paths, {{"model.safetensors.index.json", index}}));
  EXPECT_FALSE(missing.hf[0].complete);
  EXPECT_TRUE(HasProblem(missing, "model", "1 of 2 shards missing")) << Describe(missing);
  EXPECT_TRUE(HasProblem(missing, "model-00002-of-00002.safetensors", "missing"));
  // A broken index is a problem, not an error.
  Layout broken = MustDetect(Listing(paths, {{"model.safetensors.index.json", "{"}}));
  EXPECT_TRUE(HasProblem(broken, "model.safetensors.index.json", "does not parse"));
}

TEST(LayoutTest, HfSingleFileAndOtherPrefixes) {
  Layout l = MustDetect(Listing({"model.safetensors", "config.json"}));
  ASSERT_EQ(l.hf.size(), 1u);
  EXPECT_TRUE(l.hf[0].single_file);
  EXPECT_TRUE(l.hf[0].complete);
  // Shards without their index cannot be loaded by transformers.
  Layout diff = MustDetect(Listing({"diffusion_pytorch_model-00001-of-00001.safetensors"}));
  ASSERT_EQ(diff.hf.size(), 1u);
  EXPECT_EQ(diff.hf[0].prefix, "diffusion_pytorch_model");
  EXPECT_FALSE(diff.hf[0].complete);
  EXPECT_TRUE(HasProblem(diff, "diffusion_pytorch_model", "sharded without"));
}

TEST(LayoutTest, SeveralLayoutsInOneDirectory) {
  // A safetensors export beside a DeepSpeed tag: DeepSpeed is the primary kind, both described.
  Layout l = MustDetect(Listing(
      Concat({DeepSpeedTagFiles("global_step500", 1, 2, false), {"model.safetensors", "latest"}}),
      {{"latest", "global_step500"}}));
  EXPECT_EQ(l.kind, Kind::kDeepSpeed);
  EXPECT_EQ(l.hf.size(), 1u);
  EXPECT_TRUE(l.problems.empty()) << Describe(l);
}

TEST(LayoutTest, UnknownDirectories) {
  EXPECT_EQ(MustDetect({}).kind, Kind::kUnknown);
  Layout l = MustDetect(Listing({"data/train.bin", "notes.txt", "latest", "ckpt/"}));
  EXPECT_EQ(l.kind, Kind::kUnknown);
  EXPECT_TRUE(l.problems.empty());
  EXPECT_EQ(Describe(l), "kind: unknown\n");
}

TEST(LayoutTest, MalformedListingsAreInvalid) {
  for (const char* bad : {"/abs", "a//b", "a/", "./a", "a/../b", "a/."}) {
    Entry e;
    e.path = bad;
    EXPECT_EQ(Detect({e}).status().code(), Code::kInvalid) << bad;
  }
  EXPECT_EQ(Detect({Entry{""}}).status().code(), Code::kInvalid);
  EXPECT_EQ(Detect(Listing({"a/b", "a/b"})).status().code(), Code::kInvalid);
  EXPECT_EQ(Detect(Listing({"a/", "a/"})).status().code(), Code::kInvalid);
  EXPECT_EQ(Detect(Listing({"a", "a/b"})).status().code(), Code::kInvalid);
  EXPECT_EQ(Detect(Listing({"a/b", "a"})).status().code(), Code::kInvalid);
  EXPECT_EQ(Detect(Listing({"a", "a/"})).status().code(), Code::kInvalid);
  EXPECT_TRUE(Detect(Listing({"a/", "a/b"})).ok());
}

TEST(LayoutTest, ListingOrderDoesNotMatter) {
  auto paths = Concat({MegatronIter("iter_0000100", 2, 2, 1, true, false, true),
                       MegatronIter("iter_0000200", 2, 2, 1, true, false),
                       DeepSpeedTagFiles("global_step1", 2, 2, true),
                       {"latest_checkpointed_iteration.txt", "model.safetensors", ".metadata",
                        "__0_0.distcp", "x/.metadata.tmp"}});
  const std::map<std::string, std::string> contents = {
      {"latest_checkpointed_iteration.txt", "100"}};
  const std::string expected = Describe(MustDetect(Listing(paths, contents)));
  std::mt19937 rng(7);
  for (int i = 0; i < 5; ++i) {
    std::shuffle(paths.begin(), paths.end(), rng);
    EXPECT_EQ(Describe(MustDetect(Listing(paths, contents))), expected);
  }
}

TEST(LayoutTest, WantsContent) {
  EXPECT_TRUE(WantsContent("latest"));
  EXPECT_TRUE(WantsContent("latest_universal"));
  EXPECT_TRUE(WantsContent("latest_checkpointed_iteration.txt"));
  EXPECT_TRUE(WantsContent("model.safetensors.index.json"));
  EXPECT_FALSE(WantsContent("sub/model.safetensors.index.json"));
  EXPECT_FALSE(WantsContent("global_step1/latest"));
  EXPECT_FALSE(WantsContent("model.safetensors"));
}

}  // namespace
}  // namespace ckptfs::layout
