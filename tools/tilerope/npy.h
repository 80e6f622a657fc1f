#pragma once
/// \file npy.h
/// NumPy .npy files for the command-line program: read (format 1.0, 2.0, 3.0) and write (1.0,
/// or 2.0 when the header needs it), little-endian, C order, five element types.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tilerope::cli {

/// The contents of one .npy file.
struct npy_array {
  std::string descr;                ///< "<f4", "<f2", "<u2", "<i4" or "<i8" ('|', '=' read as '<')
  std::vector<std::int64_t> shape;  ///< () for a scalar
  std::vector<unsigned char> data;  ///< the elements, row-major
};

/// What a file is expected to hold; it decides which descrs read_npy accepts.
enum class npy_content {
  any,      ///< f4, f2, u2, i4, i8
  floats,   ///< f4, f2, u2 (bf16 bits): q and k
  integers  ///< i4, i8: positions
};

/// Reads `path`. A bad magic or version, a malformed header, an unsupported or big-endian
/// dtype, Fortran order and truncated data are tilerope::errors naming the file and the fault.
npy_array read_npy(const std::string& path, npy_content want = npy_content::any);
/// The same from the bytes of a file held in memory; `name` stands for the path in errors.
npy_array read_npy_bytes(const void* data, std::size_t size, const std::string& name,
                         npy_content want = npy_content::any);

/// The bytes per element of a supported descr ("<f4" -> 4), 0 for any other.
std::size_t npy_item_size(const std::string& descr);

/// A complete .npy file written to `path + ".tmp-XXXXXX"` beside `path`. commit() renames it
/// over `path`; a pending file never committed is removed by the destructor. Writing several
/// outputs as pending files first, then committing them, leaves every destination untouched
/// when any of the writes fails.
class pending_npy {
 public:
  /// Writes the temporary. `bytes` must be the product of `shape` times the item size.
  /// Throws tilerope::error (naming `path`) on any failure, leaving no temporary behind.
  pending_npy(const std::string& path, const std::string& descr,
              const std::vector<std::int64_t>& shape, const void* data, std::size_t bytes);
  pending_npy(pending_npy&& other) noexcept;
  pending_npy& operator=(pending_npy&&) = delete;
  pending_npy(const pending_npy&) = delete;
  pending_npy& operator=(const pending_npy&) = delete;
  ~pending_npy();

  /// Renames the temporary over the destination (atomic on one file system).
  void commit();

 private:
  std::string path_;
  std::string temp_;  ///< empty once committed or moved from
};

/// Writes `path` whole or not at all: a temporary beside it, then a rename over it. On any
/// failure an existing `path` is left as it was and tilerope::error names the file.
void write_npy_atomic(const std::string& path, const std::string& descr,
                      const std::vector<std::int64_t>& shape, const void* data, std::size_t bytes);

}  // namespace tilerope::cli
