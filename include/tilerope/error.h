#pragma once
/// \file error.h
/// The one exception type of tilerope.

#include <stdexcept>
#include <string>

namespace tilerope {

/// Raised for every invalid argument, before any output is written. The message names the
/// argument and the offending values, e.g. "rotary_dim (130) must be even and <= head_dim (128)".
class error : public std::runtime_error {
 public:
  explicit error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tilerope
