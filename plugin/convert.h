// Converters from the v11 properties (what api.cc fills) to the other layouts: one function per
// changed field set, so that no version repeats the property logic.
#pragma once

#include "plugin/nccl/net_v10.h"
#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/net_v12.h"
#include "plugin/nccl/net_v8.h"

namespace optireduce::plugin {

// v12: v11 with room for 8 devices per virtual NIC, plus the NIC's rail and plane.
inline nccl::ncclNetProperties_v12_t to_v12(const nccl::ncclNetProperties_v11_t& p) {
  static_assert(nccl::NCCL_NET_MAX_DEVS_PER_NIC <= nccl::NCCL_NET_MAX_DEVS_PER_NIC_V12);
  nccl::ncclNetProperties_v12_t o{};
  o.name = p.name;
  o.pciPath = p.pciPath;
  o.guid = p.guid;
  o.ptrSupport = p.ptrSupport;
  o.regIsGlobal = p.regIsGlobal;
  o.forceFlush = p.forceFlush;
  o.speed = p.speed;
  o.port = p.port;
  o.latency = p.latency;
  o.maxComms = p.maxComms;
  o.maxRecvs = p.maxRecvs;
  o.netDeviceType = p.netDeviceType;
  o.netDeviceVersion = p.netDeviceVersion;
  o.vProps.ndevs = p.vProps.ndevs;
  for (int i = 0; i < nccl::NCCL_NET_MAX_DEVS_PER_NIC; ++i) o.vProps.devs[i] = p.vProps.devs[i];
  o.maxP2pBytes = p.maxP2pBytes;
  o.maxCollBytes = p.maxCollBytes;
  o.maxMultiRequestSize = p.maxMultiRequestSize;
  // Nothing the plugin reads about its devices says which rail or plane of the fabric a NIC is
  // on, and a guessed id would make NCCL pair NICs by a rail that does not exist. Unknown is
  // also what NCCL 2.30 fills in for a v11 plugin, so v12 changes nothing in its topology.
  o.railId = nccl::NCCL_NET_ID_UNDEF;
  o.planeId = nccl::NCCL_NET_ID_UNDEF;
  return o;
}

// v9 and v10: v11 without maxMultiRequestSize.
inline nccl::ncclNetProperties_v10_t to_v10(const nccl::ncclNetProperties_v11_t& p) {
  nccl::ncclNetProperties_v10_t o{};
  o.name = p.name;
  o.pciPath = p.pciPath;
  o.guid = p.guid;
  o.ptrSupport = p.ptrSupport;
  o.regIsGlobal = p.regIsGlobal;
  o.forceFlush = p.forceFlush;
  o.speed = p.speed;
  o.port = p.port;
  o.latency = p.latency;
  o.maxComms = p.maxComms;
  o.maxRecvs = p.maxRecvs;
  o.netDeviceType = p.netDeviceType;
  o.netDeviceVersion = p.netDeviceVersion;
  o.vProps = p.vProps;
  o.maxP2pBytes = p.maxP2pBytes;
  o.maxCollBytes = p.maxCollBytes;
  return o;
}

// v8: no forceFlush, no virtual devices, no size limits (NCCL assumes its own).
inline nccl::ncclNetProperties_v8_t to_v8(const nccl::ncclNetProperties_v11_t& p) {
  nccl::ncclNetProperties_v8_t o{};
  o.name = p.name;
  o.pciPath = p.pciPath;
  o.guid = p.guid;
  o.ptrSupport = p.ptrSupport;
  o.regIsGlobal = p.regIsGlobal;
  o.speed = p.speed;
  o.port = p.port;
  o.latency = p.latency;
  o.maxComms = p.maxComms;
  o.maxRecvs = p.maxRecvs;
  o.netDeviceType = p.netDeviceType;
  o.netDeviceVersion = p.netDeviceVersion;
  return o;
}

}  // namespace optireduce::plugin
