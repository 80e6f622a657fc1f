#pragma once
// NumPy .npy files: read (format 1.0, 2.0, 3.0) and write (1.0), little-endian C order.

#include <cstdint>
#include <string>
#include <vector>

namespace tilerope::cli {

struct npy_array {
  std::string descr;  // "<f4", "<f2", "<u2", "<i4", "<i8"
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> data;
};

/// Reads `path`. Big-endian data, Fortran order, unsupported dtypes and truncated files are
/// tilerope::errors that name the file.
npy_array read_npy(const std::string& path);

/// Writes to a temporary file beside `path`, then renames it over `path`: an existing file
/// is replaced whole or not at all.
void write_npy_atomic(const std::string& path, const std::string& descr,
                      const std::vector<std::int64_t>& shape, const void* data, std::size_t bytes);

}  // namespace tilerope::cli
