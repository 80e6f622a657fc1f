#pragma once
// The ceiling loops of `tilerope bench`: the plainest loops over a kernel's own buffers with
// its access pattern (read-modify-write in place, a copy out of place), in every form the CPU
// offers. The bench times each form and takes the fastest as the ceiling.

#include <cstddef>
#include <string>
#include <vector>

namespace tilerope::bench {

/// How a ceiling loop moves its bytes: its vector width (16 bytes, or 32 / 64 where the CPU
/// has AVX2 / AVX-512), normal or streaming stores (a copy), and with or without a software
/// prefetch `ceiling_prefetch_bytes` beyond each 64-byte line of every buffer it reads.
struct loop_form {
  int width = 16;  ///< 0: memcpy (a copy reading one buffer)
  bool streaming = false, prefetch = false;
  std::string name() const;  ///< "64-byte, streaming stores, prefetch 2048"
};
constexpr std::size_t ceiling_prefetch_bytes = 2048;

/// The forms this CPU runs: widths 16 and those it has, each normal and streaming (streaming
/// only for a copy), each with and without prefetch; and memcpy for a copy of one buffer.
std::vector<loop_form> loop_forms(bool copy, bool reads_other);

/// In place: p += 0, or p += other & 0 (other read too), over `bytes` (a multiple of 16;
/// 64-byte aligned buffers), in iterations shared by `threads` threads. Values unchanged.
void rmw(unsigned char* p, const unsigned char* other, std::size_t bytes, int threads, loop_form f);
/// Out of place: to = from, or to = from + (other & 0).
void copy(const unsigned char* from, const unsigned char* other, unsigned char* to,
          std::size_t bytes, int threads, loop_form f);

}  // namespace tilerope::bench
