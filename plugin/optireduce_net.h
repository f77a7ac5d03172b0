/* The plugin's C query API: per-communicator and process-wide connection counters of
 * libnccl-net-optireduce.so, for a library in the same process (liboptireduce, a training
 * framework) that reaches them with dlsym. C89-compatible so that any caller can include it. */
#ifndef OPTIREDUCE_NET_H_
#define OPTIREDUCE_NET_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The network's name as NCCL knows it (ncclNet_t.name): what ncclConfig_t.netName names to run a
 * communicator over this plugin (NCCL 2.17 and newer). */
#define OPTIREDUCE_NET_NAME "OptiReduce"

/* Bumped whenever struct optireduceNetStats changes layout. Fields are only ever appended. */
/* 2: cutSends, repairedPkts; 3: spuriousRtos; 4: aimedMsgs, placedPkts; 5: resteers;
 * 6: spuriousProbes; 7: reorderedLosses; 8: budgetUs, allowanceUs */
#define OPTIREDUCE_NET_STATS_VERSION 8

/* Counters of a set of connections, summed (the gauges tbUs, tcUs, budgetUs and allowanceUs:
 * the largest over live connections). Every counter only grows over the life of the set, except
 * those gauges. The members are those of the list OPTIREDUCE_CONN_STATS in transport/stats.h, in
 * its order, with its meanings; they are written out so that this header stays plain,
 * self-contained C, and the library's build proves them equal to the list member by member
 * (plugin/stats.h). */
struct optireduceNetCounters {
  uint64_t msgs;           /* messages completed (a bounded receive = one step) */
  uint64_t bytes;          /* payload bytes completed: sent, or delivered */
  uint64_t dataPkts;       /* DATA datagrams sent (send side) or accepted (receive side) */
  uint64_t ctrlPkts;       /* control datagrams sent */
  uint64_t retxPkts;       /* DATA datagrams sent again */
  uint64_t rtoEvents;      /* retransmission timer expiries */
  uint64_t ctsResent;      /* clear-to-send repeated */
  uint64_t dropMalformed;  /* datagrams dropped: failed to decode */
  uint64_t dropToken;      /* ... carried another connection's token */
  uint64_t dropStale;      /* ... for a message already completed */
  uint64_t dropDuplicate;  /* ... payload already received */
  uint64_t dropBounds;     /* ... outside the posted buffer */
  uint64_t dropUnexpected; /* ... valid but unexpected in the current state */
  uint64_t bytesExpected;  /* bounded receives: bytes of the messages */
  uint64_t bytesLost;      /* bounded receives: bytes missing at completion (filled) */
  uint64_t deadlineHits;   /* bounded receives ended by their deadline */
  uint64_t earlyTimeouts;  /* bounded receives ended by the early timeout */
  uint64_t latePkts;       /* DATA dropped because its bounded receive had completed */
  uint64_t expiredSends;   /* bounded sends given up for want of a clear-to-send */
  uint64_t tbUs;           /* hard bound tB, microseconds */
  uint64_t tcUs;           /* adaptive estimate tC, microseconds */
  uint64_t probes;         /* tail-loss probes sent */
  uint64_t cutSends;       /* bounded sends ended with packets unacknowledged (deadline) */
  uint64_t repairedPkts;   /* bounded DATA sent again: lost early in a step, repaired in time */
  uint64_t spuriousRtos;   /* of rtoEvents, those an ACK then showed were no loss */
  uint64_t aimedMsgs;      /* receives the datapath posted straight into their buffer (verbs) */
  uint64_t placedPkts;     /* DATA that arrived in place, with no copy (UDP guesses, verbs) */
  uint64_t resteers;       /* aimed messages whose place stopped taking their DATA in
                            * mid-message (verbs: a lane's QP recreated, or nothing arrived
                            * for 4 x OPTIREDUCE_RTO_MAX_US), sent on elsewhere */
  uint64_t spuriousProbes; /* of probes, those whose packet the receiver already had (it said
                            * so in its ACK); each delays later probes on the connection */
  uint64_t reorderedLosses; /* messages of which a packet that SACK declared lost had only been
                             * reordered (the receiver had it when the copy came): how often the
                             * network reorders beyond what loss detection waits for */
  uint64_t budgetUs;        /* bounded: the budget a receive whose sender started gets now,
                             * microseconds: min(tB, the adaptive bound from tC) times the loss
                             * governor's stretch (up to 4x, OPTIREDUCE_LOSS_TARGET), so it may
                             * exceed tbUs. The largest over live connections, as tbUs */
  uint64_t allowanceUs;     /* bounded: how long a receive waits for a sender that has not
                             * started, microseconds: budgetUs plus the start skew the group
                             * measured between ranks (OPTIREDUCE_TIMEOUT_MS: that bound). A
                             * receive whose sender starts late may take up to allowanceUs +
                             * budgetUs */
};

struct optireduceNetStats {
  uint32_t version; /* OPTIREDUCE_NET_STATS_VERSION of the library that filled it */
  uint32_t bounded; /* 1 if the communicator runs bounded */
  uint64_t commId;  /* as asked */
  uint32_t liveSendComms;
  uint32_t liveRecvComms;
  /* This communicator: connections alive now plus every connection already closed. */
  struct optireduceNetCounters send;
  struct optireduceNetCounters recv;
  /* The whole process: every communicator of this library instance, alive or finalized. */
  struct optireduceNetCounters processSend;
  struct optireduceNetCounters processRecv;
};

/* Profiler events (NCCL 2.26 and newer, net ABI v10+). Every receive posted on a bounded
 * connection, with a profiler handle from NCCL, becomes one NCCL net-plugin event
 * (ncclProfileNetPlugin, child of the proxy step): started when NCCL posts the receive, updated
 * and stopped in the test() that reports it done. The event's plugin id is
 * OPTIREDUCE_PROFILER_NET_ID (type in the upper 16 bits, version in the lower 16, as NCCL's
 * profiler_net.h lays out ids); its data, at the start and at the update, is a pointer to one
 * optireduceProfilerRecv_v1_t, valid during the callback only: a profiler copies what it keeps. */
#define OPTIREDUCE_PROFILER_NET_TYPE (0x4F52u << 16) /* "OR"; NCCL's own are 1 (IB), 2 (socket) */
#define OPTIREDUCE_PROFILER_NET_VER 1
#define OPTIREDUCE_PROFILER_NET_ID (OPTIREDUCE_PROFILER_NET_TYPE | OPTIREDUCE_PROFILER_NET_VER)

enum { optireduceProfileBoundedRecv = 1 };
/* How a receive ended (the update's `end`). */
enum {
  optireduceRecvAll = 0,           /* every byte arrived */
  optireduceRecvDeadline = 1,      /* the deadline closed it */
  optireduceRecvEarlyTimeout = 2,  /* the early timeout after the tail closed it */
  optireduceRecvSenderExpired = 3, /* the sender gave up on it (it never had a clear-to-send) */
  optireduceRecvPending = 255      /* at the start: not ended yet */
};

typedef struct {
  uint8_t type;           /* optireduceProfileBoundedRecv */
  uint8_t end;            /* optireduceRecv*: Pending at the start, how it ended at the update */
  uint8_t bounded;        /* at the update: 1 if it could end without all its data; 0 if it ran
                             exact (a calibration step, or an LL/LL128 transfer) */
  uint8_t reserved;
  uint32_t reserved2;
  uint64_t commId;        /* the communicator's id (0 under the v10 table) */
  uint64_t bytesPosted;   /* the buffer NCCL posted */
  uint64_t bytesExpected; /* at the update: the message's size */
  uint64_t bytesLost;     /* at the update: of which missing, filled with zeros or the marker */
} optireduceProfilerRecv_v1_t;

/* Returns OPTIREDUCE_NET_STATS_VERSION. Check it before calling optireduceNetGetStats. */
int optireduceNetStatsVersion(void);

/* Fills *out for the communicator with this commId (the id NCCL passes to the v11 and v12 init;
 * 0 for connections made through the v8/v9/v10 tables, which carry no id). Returns 0 on success,
 * 1 if no live communicator has that id (the process totals are still filled, the rest is 0),
 * -1 if out is NULL. Thread-safe; cheap enough to call once per training step. */
int optireduceNetGetStats(uint64_t commId, struct optireduceNetStats* out);

#ifdef __cplusplus
}
#endif

#endif /* OPTIREDUCE_NET_H_ */
