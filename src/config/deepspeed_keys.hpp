// DeepSpeed's documented config keys that zmuon does not map onto its own options: tuning keys
// accepted with no effect, meanings zmuon does not provide (refused, with the reason), and
// feature sections taken whole. The mapped keys are schema.cpp's table.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zmuon {

enum class ds_kind : unsigned char {
  no_effect,  // a valid DeepSpeed key whose mechanism zmuon lacks or always has: noted
  refused,    // refused unless its value is one of `off` (then noted as no effect)
  section,    // a feature section taken whole: refused when "enabled" is true, else noted
};

/// The JSON type DeepSpeed takes for a key; an integer may be written 1e9.
enum class ds_type : unsigned char { any, boolean, integer, number, string, object };

struct ds_key {
  std::string path;  // dotted, from the top level
  ds_kind kind;
  ds_type type;
  std::vector<nlohmann::json> off;  // refused keys: the values that mean "off"
  std::string why;                  // refused keys and sections: why zmuon refuses it
};

/// Every such key, in DeepSpeed's documentation order.
const std::vector<ds_key>& deepspeed_keys();

/// The entry for `path`, or null.
const ds_key* find_deepspeed_key(const std::string& path);

/// Whether `v` has DeepSpeed's type `t` ("auto" always has: DeepSpeed drops it).
bool has_ds_type(const nlohmann::json& v, ds_type t);

/// How an error states a type ("true or false", "an integer", ...).
std::string ds_type_text(ds_type t);

}  // namespace zmuon
