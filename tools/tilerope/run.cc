#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "check/builtin_cases.h"
#include "check/ref_case.h"
#include "commands.h"
#include "tilerope/error.h"

namespace tilerope::cli {

namespace {

// "192KiB", "64KiB", "1MiB", "4096" -> bytes
std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    throw error("--ub '" + text + "' is not a size such as 65536, 64KiB or 1MiB");
  }
  const std::string unit = text.substr(used);
  if (unit == "KiB" || unit == "K" || unit == "k")
    n *= 1024;
  else if (unit == "MiB" || unit == "M")
    n *= 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw error("--ub '" + text + "': unknown unit '" + unit + "' (B, KiB, MiB)");
  return static_cast<std::size_t>(n);
}

tile::shape_t parse_tile(const std::string& text) {
  tile::shape_t dims;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = text.find(',', at);
    const std::string part =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    try {
      std::size_t used = 0;
      dims.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw error("--tile '" + text + "' must be comma-separated integers, e.g. 1,16,128");
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return dims;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run",
                                 "Run one reference kernel of the tile layer on the article's "
                                 "smoke shape and compare it with the fp64 golden");
  struct options {
    std::string name, tile, ub = "192KiB", dtype;
    bool list = false, json = false;
  };
  auto o = std::make_shared<options>();
  cmd->add_option("kernel", o->name, "skeleton | vision | mrope | qk-norm-rope | interleave");
  cmd->add_flag("--list", o->list, "List the reference kernels");
  cmd->add_option("--tile", o->tile, "Tile shape for set_vec_tile_shapes, e.g. 1,16,128");
  cmd->add_option("--ub", o->ub,
                  "Unified-buffer capacity: bytes, or with KiB / MiB (default 192KiB)");
  cmd->add_option("--dtype", o->dtype, "f32 | f16 | bf16 (default: the kernel's)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o, &exit_code] {
    if (o->list) {
      for (const auto& c : check::builtin_ref_cases()) {
        if (c.kernel == check::ref_kernel::interleave &&
            c.output != reference::interleave_output::split_half)
          continue;
        if (c.kernel == check::ref_kernel::interleave &&
            c.path != reference::interleave_path::deinterleave)
          continue;
        std::printf("%-14s %s\n", std::string(to_string(c.kernel)).c_str(), c.name.c_str());
      }
      return;
    }
    if (o->name.empty()) throw error("run: name a kernel (see tilerope run --list)");
    const check::ref_kernel kernel = check::ref_kernel_from_string(o->name);
    check::ref_case c;
    for (const auto& b : check::builtin_ref_cases()) {
      if (b.kernel == kernel) {
        c = b;
        break;
      }
    }
    if (!o->dtype.empty()) c.x_type = dtype_from_string(o->dtype);
    if (!o->tile.empty()) c.tiles.tile = parse_tile(o->tile);
    c.tiles.ub_bytes = parse_bytes(o->ub);
    const check::ref_result r = check::run_ref_case(c);
    if (o->json) {
      nlohmann::json j = {{"kernel", std::string(to_string(c.kernel))},
                          {"shape", r.shape},
                          {"dtype", std::string(to_string(c.x_type))},
                          {"max_abs_err", r.max_abs_err},
                          {"max_rel_err", r.max_rel_err},
                          {"atol", r.atol},
                          {"rtol", r.rtol},
                          {"pass", r.pass},
                          {"peak_ub_bytes", r.report.peak_ub_bytes},
                          {"ub_budget_bytes", r.report.ub_budget_bytes},
                          {"tiles", r.report.tiles},
                          {"seconds", r.report.seconds}};
      if (c.tiles.tile) j["tile"] = *c.tiles.tile;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("kernel          %s\n", std::string(to_string(c.kernel)).c_str());
      std::printf("shape           %s %s\n", r.shape.c_str(),
                  std::string(to_string(c.x_type)).c_str());
      std::printf("max_abs_err     %.3e (vs fp64 golden; tolerance %.1e + %.1e * |golden|)\n",
                  r.max_abs_err, r.atol, r.rtol);
      std::printf("peak_ub_bytes   %zu of %zu\n", r.report.peak_ub_bytes, r.report.ub_budget_bytes);
      std::printf("tiles           %lld\n", static_cast<long long>(r.report.tiles));
      std::printf("seconds         %.6f\n", r.report.seconds);
      std::printf("result          %s\n", r.pass ? "PASS" : "FAIL");
    }
    exit_code = r.pass ? 0 : 1;
  });
}

}  // namespace tilerope::cli
