// Parsing and matching of interface lists (IfnameFilter).
#include "transport/ifname_filter.h"

namespace optireduce {
namespace {

// The kernel's IFNAMSIZ (16) less the terminating NUL: no interface has a longer name, so a
// longer item is a typo that would silently match nothing.
constexpr size_t kMaxIfnameChars = 15;

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// Empty when `item` can name an interface, else why not.
std::string check_item(std::string_view item) {
  std::string quoted(1, '"');
  quoted.append(item).push_back('"');
  for (const char c : item) {
    if (is_blank(c)) return quoted + " has a blank inside; separate names with commas";
    if (c == '^' || c == '=')
      return quoted + ": '^' and '=' apply to the whole list and must lead it (\"^=a,b\")";
    if (c == '/') return quoted + ": interface names cannot contain '/'";
    if (c == ':')
      return quoted +
             ": ':' suffixes (ports, alias labels) do not apply to network interfaces; name the "
             "interface alone";
  }
  if (item.size() > kMaxIfnameChars)
    return quoted + " is longer than an interface name can be (15 characters)";
  return {};
}

}  // namespace

bool IfnameFilter::parse(std::string_view text, IfnameFilter* out, std::string* why) {
  IfnameFilter f;
  std::string_view rest = trim(text);
  if (rest.empty()) {
    *out = f;
    return true;
  }
  if (rest.front() == '^') {
    f.exclude_ = true;
    rest = trim(rest.substr(1));
  }
  if (!rest.empty() && rest.front() == '=') {
    f.exact_ = true;
    rest = trim(rest.substr(1));
  }
  if (!rest.empty() && rest.front() == '^') {
    *why = "'^' must come before '=' (\"^=a,b\"), not after it";
    return false;
  }
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    if (!item.empty()) {
      if (std::string bad = check_item(item); !bad.empty()) {
        *why = bad;
        return false;
      }
      f.items_.emplace_back(item);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (f.items_.empty()) {
    if (f.exclude_ || f.exact_)
      *why = std::string("'") + (f.exclude_ ? "^" : "") + (f.exact_ ? "=" : "") +
             "' must be followed by interface names";
    else
      *why = "lists no interface name";
    return false;
  }
  *out = std::move(f);
  return true;
}

bool IfnameFilter::matches(std::string_view ifname) const {
  bool listed = false;
  for (const std::string& item : items_) {
    listed = exact_ ? ifname == item : ifname.starts_with(item);
    if (listed) break;
  }
  return listed != exclude_;
}

}  // namespace optireduce
