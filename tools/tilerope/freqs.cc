#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "int64_flag.h"
#include "tilerope/error.h"
#include "tilerope/rope_config.h"

namespace tilerope::cli {

namespace {

struct freqs_args {
  std::string config;
  std::int64_t seq_len = 0;
  double theta = 0;
  int rotary_dim = 0;
  bool json = false;
  const CLI::Option* config_flag = nullptr;
  const CLI::Option* theta_flag = nullptr;
  const CLI::Option* rotary_dim_flag = nullptr;
  const CLI::Option* seq_len_flag = nullptr;
};

// %.17g: every fp64 value reads back exactly.
std::string g17(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The rope_config the flags describe: a config.json, or plain RoPE from --theta/--rotary-dim.
rope_config config_of(const freqs_args& a) {
  const bool has_config = a.config_flag->count() > 0;
  const bool has_theta = a.theta_flag->count() > 0;
  const bool has_dim = a.rotary_dim_flag->count() > 0;
  if (has_config && (has_theta || has_dim)) {
    throw error("--config reads theta and rotary_dim from the file; drop --theta/--rotary-dim");
  }
  if (has_config) return rope_config::from_hf_json(a.config);
  if (!has_theta || !has_dim) {
    throw error("give --config FILE, or --theta F with --rotary-dim N for plain RoPE");
  }
  if (a.seq_len_flag->count() > 0) {
    throw error("--seq-len only changes dynamic and longrope frequencies; it needs --config");
  }
  rope_config c;
  c.theta = a.theta;
  c.head_dim = a.rotary_dim;
  c.rotary_dim = a.rotary_dim;
  return c;
}

void run_freqs(const freqs_args& a) {
  if (a.seq_len < 0) throw error("--seq-len (" + std::to_string(a.seq_len) + ") must be >= 0");
  const rope_config c = config_of(a);
  const rope_frequencies f = c.frequencies(a.seq_len);
  const std::string type(to_string(c.scaling.type));
  std::string section = "null";
  if (c.mrope_section) {
    const auto& s = *c.mrope_section;
    section = "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " +
              std::to_string(s[2]) + "]";
  }
  if (a.json) {
    std::printf("{\n  \"rope_type\": \"%s\",\n  \"theta\": %s,\n  \"head_dim\": %d,\n",
                type.c_str(), g17(c.theta).c_str(), c.head_dim);
    std::printf("  \"rotary_dim\": %d,\n  \"attention_scaling\": %s,\n", c.effective_rotary_dim(),
                g17(f.attention_scaling).c_str());
    std::printf("  \"mrope_section\": %s,\n  \"mrope_interleaved\": %s,\n  \"inv_freq\": [",
                section.c_str(), c.mrope_interleaved ? "true" : "false");
    for (std::size_t i = 0; i < f.inv_freq.size(); ++i) {
      std::printf("%s%s", i ? ", " : "", g17(f.inv_freq[i]).c_str());
    }
    std::printf("]\n}\n");
    return;
  }
  std::printf("rope_type          %s\n", type.c_str());
  std::printf("theta              %s\n", g17(c.theta).c_str());
  std::printf("head_dim           %d\n", c.head_dim);
  std::printf("rotary_dim         %d\n", c.effective_rotary_dim());
  std::printf("attention_scaling  %s\n", g17(f.attention_scaling).c_str());
  if (c.mrope_section) {
    std::printf("mrope_section      %s (%s)\n", section.c_str(),
                c.mrope_interleaved ? "interleaved" : "chunked");
  }
  std::printf("inv_freq           %zu values (index, value)\n", f.inv_freq.size());
  for (std::size_t i = 0; i < f.inv_freq.size(); ++i) {
    std::printf("%5zu  %s\n", i, g17(f.inv_freq[i]).c_str());
  }
}

}  // namespace

void add_freqs_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "freqs", "The RoPE frequencies and attention scaling of a Hugging Face config.json");
  auto a = std::make_shared<freqs_args>();
  a->config_flag = cmd->add_option("--config", a->config,
                                   "a model's config.json: rope_theta, rope_scaling or "
                                   "rope_parameters, head_dim, ... (text_config too)")
                       ->type_name("FILE");
  a->seq_len_flag =
      cmd->add_option("--seq-len", a->seq_len,
                      "positions [0, N) the frequencies are for (dynamic and longrope depend on "
                      "it); 0 (default): unknown, the frequencies a model starts with")
          ->type_name("N")
          ->check(cli::int64_in(0, INT64_MAX));
  a->theta_flag =
      cmd->add_option("--theta", a->theta, "plain RoPE (no --config): the base")->type_name("F");
  a->rotary_dim_flag =
      cmd->add_option("--rotary-dim", a->rotary_dim, "plain RoPE (no --config): rotated dims")
          ->type_name("N");
  cmd->add_flag("--json", a->json, "one JSON object, every number as %.17g");
  cmd->callback([a] { run_freqs(*a); });
}

}  // namespace tilerope::cli
