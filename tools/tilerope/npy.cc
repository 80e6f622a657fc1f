#include "npy.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tilerope/error.h"

namespace tilerope::cli {

namespace {

// The value of 'key' in the header dict, as its literal text.
std::string header_field(const std::string& header, const std::string& key,
                         const std::string& path) {
  const std::size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw error(path + ": .npy header has no '" + key + "'");
  std::size_t v = header.find(':', at);
  if (v == std::string::npos) throw error(path + ": malformed .npy header");
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  if (v < header.size() && header[v] == '(') return header.substr(v, header.find(')', v) - v + 1);
  std::size_t end = v;
  if (header[v] == '\'')
    end = header.find('\'', v + 1) + 1;
  else
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(v, end - v);
}

std::size_t item_size(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<i8") return 8;
  return 0;
}

}  // namespace

npy_array read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error(path + ": cannot open");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    throw error(path + ": not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) throw error(path + ": truncated header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) throw error(path + ": truncated header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<std::uint32_t>(b[3]) << 24);
  } else {
    throw error(path + ": .npy format version " + std::to_string(major) + " is not supported");
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) throw error(path + ": truncated header");

  npy_array a;
  std::string descr = header_field(header, "descr", path);
  if (descr.size() < 2 || descr.front() != '\'') throw error(path + ": bad descr " + descr);
  descr = descr.substr(1, descr.size() - 2);
  if (descr.size() == 3 && (descr[0] == '|' || descr[0] == '=')) descr[0] = '<';
  if (descr.size() == 3 && descr[0] == '>') {
    throw error(path + ": big-endian data ('" + descr + "') is not supported");
  }
  if (item_size(descr) == 0) {
    throw error(path + ": dtype '" + descr +
                "' is not supported (f4, f2, u2 with --dtype bf16, i4, i8)");
  }
  a.descr = descr;
  if (header_field(header, "fortran_order", path).find("True") != std::string::npos) {
    throw error(path + ": Fortran-order arrays are not supported");
  }
  const std::string shape = header_field(header, "shape", path);
  std::int64_t count = 1;
  std::string digits;
  for (char ch : shape) {
    if (ch >= '0' && ch <= '9') {
      digits += ch;
    } else if (!digits.empty()) {
      a.shape.push_back(std::stoll(digits));
      count *= a.shape.back();
      digits.clear();
    }
  }
  const std::size_t bytes = static_cast<std::size_t>(count) * item_size(descr);
  a.data.resize(bytes);
  if (bytes &&
      !f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(bytes))) {
    throw error(path + ": truncated data: shape " + shape + " needs " + std::to_string(bytes) +
                " bytes");
  }
  return a;
}

void write_npy_atomic(const std::string& path, const std::string& descr,
                      const std::vector<std::int64_t>& shape, const void* data, std::size_t bytes) {
  std::ostringstream dict;
  dict << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  dict << "), }";
  std::string header = dict.str();
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw error(path + ": cannot write (" + tmp + ")");
    const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                  static_cast<unsigned char>(header.size() >> 8)};
    f.write("\x93NUMPY\x01\x00", 8);
    f.write(reinterpret_cast<const char*>(len), 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!f) {
      std::remove(tmp.c_str());
      throw error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error(path + ": cannot replace the file");
  }
}

}  // namespace tilerope::cli
