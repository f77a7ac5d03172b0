// Parsing and matching of interface lists (IfnameFilter).
#include "transport/ifname_filter.h"

namespace optireduce {
namespace {

// The kernel's IFNAMSIZ (16) less the terminating NUL: no interface has a longer name, so a
// longer item is a typo that would silently match nothing.
constexpr size_t kMaxIfnameChars = 15;
// IBV_SYSFS_NAME_MAX (64) less the NUL; ports are 8-bit and numbered from 1.
constexpr size_t kMaxRdmaNameChars = 63;
constexpr int kMaxRdmaPort = 255;

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// Empty when `item` can name an interface (an RDMA device and port), else why not. Sets *port
// to the item's port (-1: none) and trims it off *item.
std::string check_item(std::string_view* item, int* port, IfnameFilter::Kind kind) {
  const bool rdma = kind == IfnameFilter::Kind::kRdmaPorts;
  std::string quoted(1, '"');
  quoted.append(*item).push_back('"');
  *port = -1;
  if (const size_t colon = item->find(':'); rdma && colon != std::string_view::npos) {
    const std::string_view digits = item->substr(colon + 1);
    int p = 0;
    bool ok = !digits.empty() && digits.size() <= 3;
    for (const char c : digits) {
      ok = ok && c >= '0' && c <= '9';
      p = p * 10 + (c - '0');
    }
    if (!ok || p < 1 || p > kMaxRdmaPort)
      return quoted + ": after ':' comes a port number from 1 to 255";
    *port = p;
    item->remove_suffix(digits.size() + 1);
    if (item->empty()) return quoted + " names a port but no device";
  }
  for (const char c : *item) {
    if (is_blank(c)) return quoted + " has a blank inside; separate names with commas";
    if (c == '^' || c == '=')
      return quoted + ": '^' and '=' apply to the whole list and must lead it (\"^=a,b\")";
    if (rdma && (c == '/' || c == ':'))
      return quoted + ": device names cannot contain '/' or a second ':'";
    if (c == '/') return quoted + ": interface names cannot contain '/'";
    if (c == ':')
      return quoted +
             ": ':' suffixes (ports, alias labels) do not apply to network interfaces; name the "
             "interface alone";
  }
  if (rdma && item->size() > kMaxRdmaNameChars)
    return quoted + " is longer than an RDMA device name can be (63 characters)";
  if (!rdma && item->size() > kMaxIfnameChars)
    return quoted + " is longer than an interface name can be (15 characters)";
  return {};
}

}  // namespace

bool IfnameFilter::parse(std::string_view text, IfnameFilter* out, std::string* why, Kind kind) {
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
    std::string_view item = trim(rest.substr(0, comma));
    if (!item.empty()) {
      int port = -1;
      if (std::string bad = check_item(&item, &port, kind); !bad.empty()) {
        *why = bad;
        return false;
      }
      f.items_.emplace_back(item);
      f.ports_.push_back(port);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (f.items_.empty()) {
    if (f.exclude_ || f.exact_)
      *why = std::string("'") + (f.exclude_ ? "^" : "") + (f.exact_ ? "=" : "") +
             "' must be followed by " + (kind == Kind::kRdmaPorts ? "device" : "interface") +
             " names";
    else
      *why = kind == Kind::kRdmaPorts ? "lists no device name" : "lists no interface name";
    return false;
  }
  *out = std::move(f);
  return true;
}

bool IfnameFilter::matches(std::string_view ifname, int port) const {
  bool listed = false;
  for (size_t i = 0; i < items_.size() && !listed; ++i) {
    const std::string& item = items_[i];
    listed = (exact_ ? ifname == item : ifname.starts_with(item)) &&
             (ports_[i] < 0 || ports_[i] == port);
  }
  return listed != exclude_;
}

}  // namespace optireduce
