// User JSON as text (configs, --set values, Newton-Schulz options): parsed without recursion and
// without a throw, so that no input can crash the process (a deep nesting, a number past a
// double's range).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "zmuon/status.hpp"

namespace zmuon {

/// How deeply JSON input may nest arrays and objects: far beyond any config, and shallow enough
/// that what walks a document recursively (dump, copy, compare) cannot run out of stack.
inline constexpr int kMaxJsonDepth = 100;

/// The most a config file may hold, read from anything (a pipe, a device) that is not a
/// regular file too.
inline constexpr size_t kMaxConfigBytes = size_t(64) << 20;

/// `text` (user input: a config, an override's value, NS options) as JSON, built without
/// recursion and without a throw. Nesting deeper than kMaxJsonDepth is refused before anything
/// is built. Errors (errc::invalid_argument) are `context` (e.g. "f.json: invalid JSON: ") and
/// what is wrong with its line and column: the syntax error, a number out of a double's range
/// ("number 1e309 is out of range") or "nesting deeper than 100 levels". `not_json`, when given,
/// is set to whether the text is not JSON at all (a syntax error) rather than JSON refused.
expected<nlohmann::json> parse_json_text(const std::string& text, const std::string& context,
                                         bool ignore_comments = true, bool* not_json = nullptr);

/// The first byte of `text` where arrays and objects nest deeper than kMaxJsonDepth, or npos: a
/// scan of brackets outside strings and comments, exact for valid JSON (the parser stops at the
/// first syntax error, up to which the two agree). For parsers of their own (safetensors' header).
size_t json_too_deep_at(const std::string& text);

/// Whether `j` nests arrays and objects deeper than kMaxJsonDepth (walked without recursion):
/// for documents built elsewhere (C++ callers, the fuzzer) before anything walks them recursively.
bool json_too_deep(const nlohmann::json& j);

/// `text` as an error quotes it: cut short to `most` bytes with "..." when longer (not inside a
/// UTF-8 character).
std::string shortened_text(const std::string& text, size_t most = 100);

/// The JSON in the config file at `path`, read with parse_json_text's rules (comments allowed):
/// errors name the file. A directory, a device or a file larger than kMaxConfigBytes is refused
/// before reading (pipes are read up to that size).
expected<nlohmann::json> read_json_file(const std::string& path);

}  // namespace zmuon
