// libFuzzer target: the .npy reader of `tilerope apply`, then the view apply builds from the
// shape. Every input is read or rejected with tilerope::error; never a crash.

#include <cstdint>

#include "npy.h"
#include "tilerope/error.h"
#include "tilerope/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto a = tilerope::cli::read_npy_bytes(data, size, "fuzz.npy");
    const auto view = tilerope::tensor_view::contiguous(const_cast<unsigned char*>(a.data.data()),
                                                        tilerope::dtype::f32, a.shape);
    (void)view.numel();
  } catch (const tilerope::error&) {
  }
  return 0;
}
