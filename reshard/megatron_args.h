// Megatron-LM's `args` in a rank file: an argparse.Namespace, pickled as an object whose BUILD
// state is the dict of its attributes. Internal to reshard/megatron*.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "formats/pickle.h"

namespace ckptfs::reshard {

// The attributes' dict of `args` (a Namespace, or a plain dict); nullptr when it is neither.
pickle::ValuePtr ArgsDict(const pickle::ValuePtr& args);
// The attribute `key` when it is an int / a number (int or float) / a string; nullopt otherwise
// (absent, None, another type).
std::optional<int64_t> IntArg(const pickle::ValuePtr& d, std::string_view key);
std::optional<double> NumberArg(const pickle::ValuePtr& d, std::string_view key);
std::optional<std::string> StrArg(const pickle::ValuePtr& d, std::string_view key);
// Whether attribute `key` is true (a true bool or a non-zero int); false when absent.
bool BoolArg(const pickle::ValuePtr& d, std::string_view key);
// Replaces the value of attribute `key`; false when there is none.
bool SetArg(const pickle::ValuePtr& d, std::string_view key, pickle::ValuePtr value);

}  // namespace ckptfs::reshard
