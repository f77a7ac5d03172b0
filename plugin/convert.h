// Converters from the v11 properties (what api.cc fills) to the older layouts: one function per
// changed field set, so that no version repeats the property logic.
#pragma once

#include "plugin/nccl/net_v10.h"
#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/net_v8.h"

namespace optireduce::plugin {

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
