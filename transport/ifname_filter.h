// The interface-list syntax of OPTIREDUCE_IFNAME, which is NCCL_SOCKET_IFNAME's, so that one
// value serves both: comma-separated name prefixes; a leading `^` selects the interfaces the
// list does not match, a leading `=` makes the items exact names, `^=` both. The same syntax
// with a `:port` after a name is NCCL_IB_HCA's, and OPTIREDUCE_IB_HCA's (Kind::kRdmaPorts).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace optireduce {

class IfnameFilter {
 public:
  enum class Kind {
    kInterfaces,  // network interfaces: no ports, names of at most 15 characters
    kRdmaPorts,   // RDMA devices, each item optionally `name:port` (port 1-255)
  };
  // Parses `text`. Items are trimmed of blanks and empty ones are skipped, as NCCL skips them;
  // a text of blanks only is "not given" (empty()). Returns false, with *why saying what is
  // wrong in words that can follow the variable's name, for a value NCCL would read differently
  // from what its author meant or that can match no interface: `^`/`=` with no name after them,
  // `=^` (NCCL reads `^name` as a name), `^` or `=` inside the list, a blank inside a name, `/`
  // or `:` (a port or alias suffix: interfaces have neither), a name longer than the kernel's
  // 15 characters. kRdmaPorts: a `:` must be followed by a port number from 1 to 255, and a
  // name may have up to 63 characters (an RDMA device's).
  static bool parse(std::string_view text, IfnameFilter* out, std::string* why,
                    Kind kind = Kind::kInterfaces);

  // True when no item was given: the caller's default applies.
  bool empty() const { return items_.empty(); }
  // Whether the list selects `ifname` (port `port` of it; an item without a port matches
  // every port). False on an empty filter, whose caller applies its own default instead.
  bool matches(std::string_view ifname, int port = -1) const;

  bool exclude() const { return exclude_; }
  bool exact() const { return exact_; }
  const std::vector<std::string>& items() const { return items_; }

 private:
  bool exclude_ = false;
  bool exact_ = false;
  std::vector<std::string> items_;
  std::vector<int> ports_;  // per item: its port, -1 for any
};

}  // namespace optireduce
