#pragma once
// Case files: JSON objects whose keys are the fields of rope_case or ref_case. Unknown keys
// and bad values are errors naming the case and the key.

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "check/ref_case.h"
#include "check/rope_case.h"

namespace tilerope::check {

// A case from a JSON object whose keys are the rope_case field names.
rope_case case_from_json(const nlohmann::json& j);
// A reference-kernel case from a JSON object with a "kernel" key and ref_case field names.
ref_case ref_case_from_json(const nlohmann::json& j);

struct case_list {
  std::vector<rope_case> rope_cases;
  std::vector<ref_case> ref_cases;
};

// All cases of a file, in file order within each kind: a JSON list of case objects, or
// {"cases": [...]}; an object with a "kernel" key is a reference-kernel case.
case_list cases_from_file(const std::string& path);
// The same from a file's text; `origin` names it in errors.
case_list cases_from_text(const std::string& text, const std::string& origin);

}  // namespace tilerope::check
