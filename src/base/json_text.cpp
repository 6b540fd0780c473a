// User JSON as text (configs, --set values, Newton-Schulz options) parsed without recursion
// and without a throw: nesting refused before anything is built, errors with their position.
#include "base/json_text.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>
#include <vector>

#include <sys/stat.h>

namespace zmuon {

using json = nlohmann::json;

size_t json_too_deep_at(const std::string& text) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i], next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        i += text[i] == '\\';
    } else if (c == '/' && (next == '/' || next == '*')) {
      i = next == '/' ? text.find_first_of("\n\r", i) : text.find("*/", i + 2);
      if (i == std::string::npos)
        return i;
      i += next == '*';
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

namespace {

/// "line L, column C" of byte `at` of `text` (both from 1, as in nlohmann::json's errors).
std::string position_of(const std::string& text, size_t at) {
  at = std::min(at, text.size());
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<ptrdiff_t>(at), '\n');
  const size_t line_start = at == 0 ? 0 : text.rfind('\n', at - 1) + 1;  // npos + 1 == 0
  return "line " + std::to_string(line) + ", column " + std::to_string(at - line_start + 1);
}

/// nlohmann::json's DOM builder, but a syntax or range error is kept, with its position, instead
/// of thrown (an out-of-range number's exception carries no position), and a key given twice in
/// one object is refused (nlohmann keeps the last, so a config's first "lr" would be ignored).
class dom_builder : public nlohmann::detail::json_sax_dom_parser<json> {
  using base = json_sax_dom_parser<json>;

public:
  explicit dom_builder(json& root) : base(root, /*allow_exceptions=*/false) {}

  // sax_parse calls these on the derived type (templated, not virtual).
  bool null() { return element() && base::null(); }
  bool boolean(bool v) { return element() && base::boolean(v); }
  bool number_integer(number_integer_t v) { return element() && base::number_integer(v); }
  bool number_unsigned(number_unsigned_t v) { return element() && base::number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) {
    return element() && base::number_float(v, s);
  }
  bool string(string_t& v) { return element() && base::string(v); }
  bool binary(binary_t& v) { return element() && base::binary(v); }
  bool start_object(size_t n) {
    element();
    open.push_back({true, {}, {}, 0});
    return base::start_object(n);
  }
  bool start_array(size_t n) {
    element();
    open.push_back({false, {}, {}, 0});
    return base::start_array(n);
  }
  bool end_object() { return open.pop_back(), base::end_object(); }
  bool end_array() { return open.pop_back(), base::end_array(); }
  bool key(string_t& k) {
    if (!open.back().keys.insert(k).second) {
      failed = true;
      duplicate = true;
      what = "key \"" + shortened_text(k) + "\" appears twice in "
             + (open.size() == 1 ? std::string("the top-level object") : "the object at " + path());
      return false;
    }
    open.back().key = k;
    return base::key(k);
  }

  template <class Exception>
  bool parse_error(size_t position, const std::string& token, const Exception& ex) {
    failed = true;
    id = ex.id;
    what = ex.what();
    what = what.substr(what.find(']') + 2);  // drop "[json.exception.parse_error.101] "
    end = position;
    last_token = token;
    return false;
  }

  bool failed = false, duplicate = false;
  int id = 0;
  std::string what, last_token;
  size_t end = 0;

private:
  struct frame {
    bool object;
    std::set<std::string> keys;  // an object's keys so far
    std::string key;             // an object's current key
    size_t count;                // an array's elements so far
  };

  /// Counts a value into its enclosing array; always true.
  bool element() {
    if (!open.empty() && !open.back().object)
      ++open.back().count;
    return true;
  }

  /// Where the innermost open object is, as a JSON pointer ("/optimizer/params").
  std::string path() const {
    json::json_pointer p;
    for (size_t i = 0; i + 1 < open.size(); ++i)
      p = open[i].object ? p / open[i].key : p / (open[i].count - 1);
    return p.to_string();
  }

  std::vector<frame> open;
};

}  // namespace

/// Whether `j` nests arrays and objects deeper than kMaxJsonDepth (walked without recursion).
bool json_too_deep(const json& j) {
  std::vector<std::pair<const json*, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    auto [node, depth] = todo.back();
    todo.pop_back();
    if (!node->is_structured())
      continue;
    if (depth + 1 > kMaxJsonDepth)
      return true;
    for (const auto& child : *node)
      todo.emplace_back(&child, depth + 1);
  }
  return false;
}

/// `text` as an error quotes it: cut short when long (not inside a UTF-8 character).
std::string shortened_text(const std::string& text, size_t most) {
  if (text.size() <= most)
    return text;
  size_t cut = most - 3;
  while (cut > 0 && (uint8_t(text[cut]) & 0xC0) == 0x80)
    --cut;
  return text.substr(0, cut) + "...";
}

expected<json> parse_json_text(const std::string& text, const std::string& context,
                               bool ignore_comments, bool* not_json) {
  auto fail = [&](const std::string& what) {
    return error{errc::invalid_argument, context + what};
  };
  if (size_t at = json_too_deep_at(text); at != std::string::npos) {
    if (not_json)  // the acceptor builds nothing
      *not_json = !json::accept(text, ignore_comments);
    return fail("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels at "
                + position_of(text, at));
  }
  json j;
  dom_builder builder(j);
  json::sax_parse(text, &builder, json::input_format_t::json, /*strict=*/true, ignore_comments);
  if (not_json)
    *not_json = builder.failed && builder.id != 406 && !builder.duplicate;
  if (!builder.failed)
    return j;
  if (builder.id == 406)  // out_of_range.406: a number beyond a double's range
    return fail(
        "number " + shortened_text(builder.last_token) + " is out of range at "
        + position_of(text, builder.end - std::min(builder.end, builder.last_token.size())));
  return fail(builder.what);
}

expected<json> read_json_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return error{errc::io_error, "cannot open config file '" + path + "': " + std::strerror(errno)};
  // A directory fails only when read; a device may never end (/dev/zero). Pipes are read, with
  // a limit: `--config <(...)`.
  if (S_ISDIR(st.st_mode))
    return error{errc::invalid_argument, "config file '" + path + "' is a directory"};
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))
    return error{errc::invalid_argument, "config file '" + path + "' is not a regular file"};
  const std::string too_big =
      "config file '" + path + "' is larger than " + std::to_string(kMaxConfigBytes >> 20) + " MiB";
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kMaxConfigBytes)
    return error{errc::invalid_argument, too_big};
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return error{errc::io_error, "cannot open config file '" + path + "': " + std::strerror(errno)};
  std::string text;
  try {
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      text.append(buf, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxConfigBytes)
        return error{errc::invalid_argument, too_big};
    }
  } catch (const std::exception& e) {
    return error{errc::io_error, "cannot read config file '" + path + "': " + e.what()};
  }
  if (in.bad())
    return error{errc::io_error, "cannot read config file '" + path + "'"};
  if (std::all_of(text.begin(), text.end(), [](char c) { return std::isspace(uint8_t(c)); }))
    return error{errc::invalid_argument, path + ": the config file is empty"};
  return parse_json_text(text, path + ": invalid JSON: ");
}

}  // namespace zmuon
