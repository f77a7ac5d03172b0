// The libibverbs entry points the verbs datapath calls, resolved with dlopen at run time: the
// plugin never links libibverbs, so it loads (and runs over UDP) on hosts with no RDMA stack.
// Only the declarations of <infiniband/verbs.h> are used at build time.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "transport/status.h"

namespace optireduce::verbs {

// One pointer per exported libibverbs function we use. The data-path calls (ibv_post_send,
// ibv_post_recv, ibv_poll_cq) are not here: verbs.h defines them inline, calling through the
// provider's ops in ibv_context, so they need no symbol.
struct IbvSymbols {
  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  __be64 (*get_device_guid)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // The exported ibv_query_port takes the old, shorter attribute struct; query_port() below
  // prefers the provider's extended op, as the inline in verbs.h does.
  int (*query_port_compat)(ibv_context* context, uint8_t port,
                           _compat_ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  // Optional (rdma-core >= 32, symbol version IBVERBS_1.11): nullptr when absent, and the GID
  // type is then read from sysfs.
  int (*query_gid_ex)(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  // Optional (rdma-core >= 34, IBVERBS_1.12): nullptr when absent, and a dmabuf registration
  // then takes the host path (VerbsDevice::register_dmabuf).
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                           int access) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*query_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  ibv_ah* (*create_ah)(ibv_pd* pd, ibv_ah_attr* attr) = nullptr;
  int (*destroy_ah)(ibv_ah* ah) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;
  // Optional, all four or none (every rdma-core has them; a stub library may not): completion
  // channels, for a caller that blocks until a datagram comes (UdEndpoint::prepare_wait).
  // Without them that caller naps.
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  bool has_comp_channel() const {
    return create_comp_channel && destroy_comp_channel && get_cq_event && ack_cq_events;
  }

  // ibv_query_port as verbs.h's inline does it, through this table. *speed_ex (if given) gets
  // the port's active_speed_ex, which carries the speed codes of XDR and later (they do not
  // fit the 8-bit active_speed): the rdma-core releases that know it (2023 on) append it to
  // ibv_port_attr, so it is read whatever the headers we build with declare; 0 from a library
  // that predates it.
  int query_port(ibv_context* context, uint8_t port, ibv_port_attr* attr,
                 uint32_t* speed_ex = nullptr) const;
};

// The process-wide table, loaded from libibverbs.so.1 on first use (thread-safe). Returns
// nullptr when the library or one of the required symbols is missing; *error (if given) then
// says which. The library is never unloaded: providers and open contexts point into it.
const IbvSymbols* ibv_symbols(std::string* error = nullptr);

// Loads `library` into *out without caching (tests use it to exercise the failure path).
// Returns kSystem with ENOENT when the library cannot be opened, ENOSYS when a required symbol
// is missing; *error says which.
Status load_ibv_symbols(const char* library, IbvSymbols* out, std::string* error);

}  // namespace optireduce::verbs
