// megatron.core's `torch_dist` checkpoints (dist_checkpointing on PyTorch DCP) read as the whole
// model's tensors: each layer's slice of the stacked `decoder.layers.*` tensors, and each
// expert's slice of the experts' (`mlp.experts.experts.*`, an expert axis after the layer axis,
// or first in per-layer keys), as shards in the order their chunks tile it. What the hf view
// plans from (docs/views.md).
//
// Pure: the caller parses `.metadata`, describes the data files and parses common.pt.
#pragma once

#include <vector>

#include "common/status.h"
#include "formats/dcp.h"
#include "formats/torch_file.h"
#include "reshard/dcp_view.h"
#include "reshard/megatron.h"

namespace ckptfs::reshard {

// The DCP item holding a torch_dist iteration's common state (args, iteration, ...), as
// Megatron writes it since 2026-07 (before: common.pt beside .metadata); nullptr when none.
const dcp::BytesEntry* CommonStateItem(const dcp::Metadata& md);
// common.pt's bytes, or the common state item's (torch.save([state])), parsed; the root is the
// state dict. Errors (kInvalid): not a torch.save archive.
Result<TorchFile> ParseTorchDistCommon(const std::string& bytes);

// `common`: the file holding `args` (common.pt, or the common state item). The model's tensors,
// layer by layer (within a layer in the order .metadata names them); an expert's weights named
// as SequentialMLP's in a rank file (decoder.layers.N.mlp.experts.local_experts.X.*, X the
// global expert number, MegatronTensor::expert X); the optimizer's state and the non-tensor
// items are left out. Errors (kInvalid, naming the key): no args, a chunk missing from the file
// descriptions or not contiguous, chunks that do not tile their tensor, a stacked tensor whose
// leading axes are not the layers (and experts), the per-expert keys and _w/_v halves of
// singleton_local_shards.
Result<MegatronTensors> ListTorchDistTensors(const TorchFile& common, const dcp::Metadata& md,
                                             const std::vector<DcpDataFile>& files);

}  // namespace ckptfs::reshard
