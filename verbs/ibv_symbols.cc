// Resolves the libibverbs table with dlopen/dlvsym. Each symbol is looked up at the version the
// rdma-core headers we build with bind to by default, so the ABI of every call matches its
// declaration (several functions also exist at an incompatible IBVERBS_1.0 version).
#include "verbs/ibv_symbols.h"

#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace optireduce::verbs {
namespace {

// The soname, not the unversioned libibverbs.so: that link only exists with libibverbs-dev,
// which a machine that merely runs the plugin does not have.
constexpr const char* kLibrary = "libibverbs.so.1";

// Resolves `name` at `version`, falling back to the default version for builds of rdma-core
// that export it unversioned.
template <typename Fn>
bool resolve(void* lib, const char* name, const char* version, Fn* out) {
  void* p = dlvsym(lib, name, version);
  if (p == nullptr) p = dlsym(lib, name);
  *out = reinterpret_cast<Fn>(p);
  return p != nullptr;
}

// Where rdma-core puts active_speed_ex: declared after port_cap_flags2 where the headers have
// it, else the next 4-byte boundary after port_cap_flags2, where later releases added it.
template <typename Attr>
constexpr size_t speed_ex_offset() {
  if constexpr (requires(Attr a) { a.active_speed_ex; })
    return offsetof(Attr, active_speed_ex);
  else
    return (offsetof(Attr, port_cap_flags2) + sizeof(uint16_t) + 3) & ~size_t{3};
}
constexpr size_t kSpeedExOffset = speed_ex_offset<ibv_port_attr>();
constexpr size_t kPortAttrWithSpeedExBytes =
    std::max(sizeof(ibv_port_attr), kSpeedExOffset + sizeof(uint32_t));

}  // namespace

int IbvSymbols::query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr,
                           uint32_t* speed_ex) const {
  if (speed_ex != nullptr) *speed_ex = 0;
  verbs_context* vctx = verbs_get_ctx_op(context, query_port);
  if (vctx == nullptr) {
    *attr = ibv_port_attr{};
    return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  // The library zeroes the whole buffer and fills the attributes it knows, however long the
  // buffer: a longer one than our headers' struct gets active_speed_ex from a library that
  // has it and stays 0 past the end of an older library's struct.
  alignas(ibv_port_attr) unsigned char buf[kPortAttrWithSpeedExBytes] = {};
  const int rc =
      vctx->query_port(context, port, reinterpret_cast<ibv_port_attr*>(buf), sizeof(buf));
  if (rc != 0) return rc;
  std::memcpy(attr, buf, sizeof(*attr));
  if (speed_ex != nullptr) std::memcpy(speed_ex, buf + kSpeedExOffset, sizeof(*speed_ex));
  return 0;
}

Status load_ibv_symbols(const char* library, IbvSymbols* out, std::string* error) {
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (error) {
      const char* why = dlerror();
      *error = std::string("cannot load ") + library + ": " + (why ? why : "unknown error");
    }
    return Status(Errc::kSystem, ENOENT);
  }
  IbvSymbols s;
  const char* missing = nullptr;
  // IBVERBS_1.1 is the version every current export below defaults to.
  constexpr const char* v11 = "IBVERBS_1.1";
  auto need = [&](const char* name, auto* fn) {
    if (!resolve(lib, name, v11, fn) && missing == nullptr) missing = name;
  };
  need("ibv_get_device_list", &s.get_device_list);
  need("ibv_free_device_list", &s.free_device_list);
  need("ibv_get_device_name", &s.get_device_name);
  need("ibv_get_device_guid", &s.get_device_guid);
  need("ibv_open_device", &s.open_device);
  need("ibv_close_device", &s.close_device);
  need("ibv_query_device", &s.query_device);
  need("ibv_query_port", &s.query_port_compat);
  need("ibv_query_gid", &s.query_gid);
  need("ibv_alloc_pd", &s.alloc_pd);
  need("ibv_dealloc_pd", &s.dealloc_pd);
  need("ibv_reg_mr", &s.reg_mr);
  need("ibv_dereg_mr", &s.dereg_mr);
  need("ibv_create_cq", &s.create_cq);
  need("ibv_destroy_cq", &s.destroy_cq);
  need("ibv_create_qp", &s.create_qp);
  need("ibv_modify_qp", &s.modify_qp);
  need("ibv_query_qp", &s.query_qp);
  need("ibv_destroy_qp", &s.destroy_qp);
  need("ibv_create_ah", &s.create_ah);
  need("ibv_destroy_ah", &s.destroy_ah);
  need("ibv_wc_status_str", &s.wc_status_str);
  resolve(lib, "_ibv_query_gid_ex", "IBVERBS_1.11", &s.query_gid_ex);  // optional
  resolve(lib, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", &s.reg_dmabuf_mr);  // optional
  resolve(lib, "ibv_create_comp_channel", "IBVERBS_1.0", &s.create_comp_channel);  // optional
  resolve(lib, "ibv_destroy_comp_channel", "IBVERBS_1.0", &s.destroy_comp_channel);
  resolve(lib, "ibv_get_cq_event", v11, &s.get_cq_event);
  resolve(lib, "ibv_ack_cq_events", v11, &s.ack_cq_events);
  if (missing != nullptr) {
    if (error) *error = std::string(library) + " lacks " + missing;
    dlclose(lib);
    return Status(Errc::kSystem, ENOSYS);
  }
  *out = s;
  return Status::ok();
}

const IbvSymbols* ibv_symbols(std::string* error) {
  struct Loaded {
    IbvSymbols table;
    Status status;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    l.status = load_ibv_symbols(kLibrary, &l.table, &l.error);
    return l;
  }();
  if (!loaded.status.is_ok()) {
    if (error) *error = loaded.error;
    return nullptr;
  }
  return &loaded.table;
}

}  // namespace optireduce::verbs
