// `tilerope apply`: its flags and their help. apply_parse.cc checks and parses the flags,
// apply_build.cc reads the files and builds the call, apply_run.cc runs it and writes outputs.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apply_call.h"
#include "apply_options.h"
#include "commands.h"
#include "int64_flag.h"

namespace tilerope::cli {

namespace {

constexpr char apply_footer[] = R"(Variants (--variant):
  rope          (default) --style neox|gptj; positions [T] / [S] / [B, S] or --offset; --theta or --config
  vision        Qwen2-VL / Qwen2.5-VL vision tower, neox over the whole head, q and k [S, N, D]:
                --positions [S, 2] (row, col per patch) with --theta (2D frequencies), or
                --cos/--sin rows [S, D] as HF passes them
  mrope         Qwen2-VL / Qwen3-VL text MRoPE, neox, q and k [T, H, D]: --positions [3, T] with
                --theta or --config, or --cos/--sin planes [3, T, D]; --section T,H,W (sum
                rotary_dim/2; from --config when absent) and --section-layout chunked|interleaved
  qk-norm-rope  Qwen3 per-head RMSNorm of q and k, then RoPE (--style, default neox):
                --q-weight/--k-weight [D], --eps, --rounding fp32_once|hf_qwen3. With --backward:
                --q/--k are the forward's inputs, --grad-q/--grad-k the gradients of its outputs;
                dq/dk go to --out-q/--out-k, the weight gradients (float32 [D]) to
                --out-q-weight-grad/--out-k-weight-grad
  interleave    adjacent pairs (gptj); --output-layout interleaved|split-half (split-half: the
                NPU's InterleaveRope); --theta/--config with positions, or --cos/--sin rows
                [T, D] (thd), [S, D] or [B, S, D] (bshd, bhsd)
--backward applies the inverse rotation (the gradient w.r.t. x) for every variant but
qk-norm-rope, whose backward is described above. A flag the variant does not use is an error.)";

}  // namespace

void add_apply_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "apply",
      "Rotate q (and k) read from .npy files with one RoPE variant; write .npy outputs of the "
      "same dtype and shape");
  cmd->footer(apply_footer);
  auto a = std::make_shared<apply_args>();
  const std::vector<apply_variant> all = {apply_variant::rope, apply_variant::vision,
                                          apply_variant::mrope, apply_variant::qk_norm_rope,
                                          apply_variant::interleave};
  // Registers a flag: its help says which variants read it.
  const auto flag = [&](CLI::Option* o, const std::string& name, std::vector<apply_variant> used_by,
                        const std::string& help, std::string note = "") {
    std::string who;
    if (used_by.size() == all.size()) {
      who = "[all variants] ";
    } else {
      for (apply_variant u : used_by) who += (who.empty() ? "[" : ", ") + name_of(u);
      who += "] ";
    }
    o->description(who + help);
    a->rules.push_back({name, o, std::move(used_by), std::move(note)});
    return o;
  };
  flag(cmd->add_option("--variant", a->variant_name)
           ->type_name("rope|vision|mrope|qk-norm-rope|interleave"),
       "--variant", all, "which RoPE variant (default rope); see below");
  flag(cmd->add_option("--q", a->q)->type_name("FILE")->required(), "--q", all,
       "q .npy: [T, H, D] (thd), [B, S, H, D] (bshd) or [B, H, S, D] (bhsd); float32, float16, "
       "or uint16 holding bf16 bits (with --dtype bf16). With qk-norm-rope --backward: the "
       "forward's input q");
  flag(cmd->add_option("--k", a->k)->type_name("FILE"), "--k", all,
       "k .npy: as q, same dtype and layout; its head count may differ (GQA). Needs --out-k");
  flag(cmd->add_option("--positions", a->positions)->type_name("FILE"), "--positions", all,
       "int32 or int64 .npy of positions. rope, qk-norm-rope, interleave: [T] for thd; [S] "
       "(shared by the batch) or [B, S] for bshd and bhsd (or --offset). vision: [S, 2], the "
       "(row, col) of each patch. mrope: [3, T] (temporal, height, width)");
  flag(cmd->add_option("--offset", a->offset)->type_name("N")->check(cli::int64_in(0, INT64_MAX)),
       "--offset", {apply_variant::rope, apply_variant::qk_norm_rope, apply_variant::interleave},
       "consecutive positions N, N + 1, ... for the T (or S) tokens. Or --positions");
  flag(cmd->add_option("--style", a->style)->type_name("neox|gptj"), "--style",
       {apply_variant::rope, apply_variant::qk_norm_rope},
       "neox (rotate halves) or gptj (adjacent pairs); required for rope, default neox for "
       "qk-norm-rope",
       "; vision and mrope rotate neox, interleave gptj");
  flag(cmd->add_option("--theta", a->theta)->type_name("F"), "--theta", all,
       "RoPE base, finite and > 0: inv_freq[i] = theta^(-2i/rotary_dim) (vision: "
       "theta^(-2j/(D/2)) per axis). Or --config, or --cos/--sin");
  flag(cmd->add_option("--config", a->config)->type_name("FILE"), "--config",
       {apply_variant::rope, apply_variant::mrope, apply_variant::qk_norm_rope,
        apply_variant::interleave},
       "a Hugging Face config.json instead of --theta: its rope_theta, rotary_dim and scaling "
       "(linear, dynamic, YaRN, LongRoPE, Llama 3) for positions up to the largest given; "
       "mrope takes its mrope_section when --section is absent",
       "; the vision tower's frequencies come from --theta");
  flag(cmd->add_option("--cos", a->cos)->type_name("FILE"), "--cos",
       {apply_variant::vision, apply_variant::mrope, apply_variant::interleave},
       "per-token cos rows instead of --theta/--config and positions, rotary_dim or "
       "rotary_dim/2 wide, float32, float16 or bf16 bits: vision [S, D]; mrope planes [3, T, w]; "
       "interleave [T, w] (thd), [S, w] or [B, S, w] (bshd, bhsd). A full row's columns pair "
       "as the output does: (i, i + r/2) for halves and split-half, (2i, 2i+1) for adjacent");
  flag(cmd->add_option("--sin", a->sin)->type_name("FILE"), "--sin",
       {apply_variant::vision, apply_variant::mrope, apply_variant::interleave},
       "per-token sin rows, shaped and typed as --cos");
  flag(cmd->add_option("--rotary-dim", a->rotary_dim)->type_name("N"), "--rotary-dim",
       {apply_variant::rope, apply_variant::mrope, apply_variant::qk_norm_rope,
        apply_variant::interleave},
       "leading dims rotated per head, even and <= head_dim (default head_dim); the rest pass "
       "through unchanged",
       "; vision rotates the whole head");
  flag(cmd->add_option("--layout", a->layout)->type_name("thd|bshd|bhsd"), "--layout",
       {apply_variant::rope, apply_variant::qk_norm_rope, apply_variant::interleave},
       "thd (default), bshd or bhsd: how q and k files are laid out (see --q)",
       "; vision and mrope take thd: q [T, H, D]");
  flag(cmd->add_option("--dtype", a->dtype_name)->type_name("f32|f16|bf16"), "--dtype", all,
       "f32, f16 or bf16: the dtype of q and k; required for bf16 (uint16 files, read as bf16 "
       "bits in every input then), otherwise taken from the files and checked against them");
  flag(cmd->add_flag("--backward", a->backward), "--backward", all,
       "the gradient w.r.t. x: the inverse rotation; qk-norm-rope: its backward (see below)");
  flag(cmd->add_option("--table", a->table)->type_name("none|f32|x"), "--table", all,
       "none (default): cos/sin computed per token; f32 or x: looked up in a [max position + 1, "
       "rotary_dim/2] table of fp32 or of the q dtype (with --theta or --config)");
  flag(cmd->add_option("--precision", a->precision)->type_name("accurate|hf_compat"), "--precision",
       all,
       "accurate (default): fp64 angles; hf_compat: fp32 angles as HF transformers, cos/sin "
       "rounded to the q dtype");
  flag(cmd->add_option("--section", a->section)->type_name("T,H,W"), "--section",
       {apply_variant::mrope},
       "frequencies per axis (temporal, height, width), summing to rotary_dim/2, e.g. 16,24,24 "
       "(Qwen2-VL) or 24,20,20 (Qwen3-VL)");
  flag(cmd->add_option("--section-layout", a->section_layout)->type_name("chunked|interleaved"),
       "--section-layout", {apply_variant::mrope},
       "chunked (default; Qwen2-VL, Qwen2.5-VL: T..T H..H W..W) or interleaved (Qwen3-VL: T H W "
       "T H W ...); with --config and without it, the config's mrope_interleaved");
  flag(cmd->add_option("--q-weight", a->q_weight)->type_name("FILE"), "--q-weight",
       {apply_variant::qk_norm_rope},
       "q's RMSNorm weight [D]: float32, float16 or bf16 bits (with --dtype bf16); required");
  flag(cmd->add_option("--k-weight", a->k_weight)->type_name("FILE"), "--k-weight",
       {apply_variant::qk_norm_rope}, "k's RMSNorm weight [D], as --q-weight; required with --k");
  flag(cmd->add_option("--eps", a->eps)->type_name("F"), "--eps", {apply_variant::qk_norm_rope},
       "RMSNorm epsilon, finite and >= 0 (default 1e-6)");
  flag(cmd->add_option("--rounding", a->rounding)->type_name("fp32_once|hf_qwen3"), "--rounding",
       {apply_variant::qk_norm_rope},
       "fp32_once (default): fp32 throughout, rounded once; hf_qwen3: rounded to the q dtype "
       "where HF's Qwen3 rounds (neox only, no --backward)");
  flag(cmd->add_option("--grad-q", a->grad_q)->type_name("FILE"), "--grad-q",
       {apply_variant::qk_norm_rope},
       "with --backward: dL/d(q output), q's shape and dtype; required");
  flag(cmd->add_option("--grad-k", a->grad_k)->type_name("FILE"), "--grad-k",
       {apply_variant::qk_norm_rope},
       "with --backward: dL/d(k output), k's shape and dtype; with --k");
  flag(cmd->add_option("--out-q-weight-grad", a->out_q_weight_grad)->type_name("FILE"),
       "--out-q-weight-grad", {apply_variant::qk_norm_rope},
       "with --backward: output .npy for dL/d(q weight), float32 [D] (optional)");
  flag(cmd->add_option("--out-k-weight-grad", a->out_k_weight_grad)->type_name("FILE"),
       "--out-k-weight-grad", {apply_variant::qk_norm_rope},
       "with --backward and --k: output .npy for dL/d(k weight), float32 [D] (optional)");
  flag(cmd->add_option("--output-layout", a->output_layout)->type_name("interleaved|split-half"),
       "--output-layout", {apply_variant::interleave},
       "interleaved (default): pairs written back in place; split-half: first elements in "
       "[0, r/2), second in [r/2, r) (NPU InterleaveRope)");
  flag(cmd->add_option("--out-q", a->out_q)->type_name("FILE")->required(), "--out-q", all,
       "output .npy for q (qk-norm-rope --backward: dq), same dtype and shape; replaced whole or "
       "not at all");
  flag(cmd->add_option("--out-k", a->out_k)->type_name("FILE"), "--out-k", all,
       "output .npy for k (with --k; qk-norm-rope --backward: dk)");
  cmd->callback([a] {
    const apply_request request = parse_apply_args(*a);
    apply_call call;
    build_apply_call(request, call);
    run_apply_call(request, call);
    write_apply_outputs(request, call);
  });
}

}  // namespace tilerope::cli
