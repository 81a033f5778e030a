/* The remote GPU wire protocol, shared by the client library
 * (libgpuwarden-remote.so) and gpuwarden-worker. README.md beside this file
 * describes it; this header is its definition.
 *
 * A connection is a byte stream of frames. Every frame is a 24-byte header
 * and a payload of header.len bytes; integers are little-endian:
 *
 *   u32 len    payload bytes, at most GWR_MAX_PAYLOAD
 *   u16 op     GWR_OP_*
 *   u16 flags  GWR_F_SYNC: the sender waits for a GWR_OP_REPLY with this seq
 *   u32 seq    matches a reply to its request; 0 for asynchronous frames
 *   u32 zero   reserved, 0
 *   u64 ctx    the client's current context handle (0: none)
 *
 * The payload's fields follow the op's format (gwr_formats in decode.c):
 * 'q' a u64, 'i' a u32, 'h' a 32-byte SHA-256, 'b' the rest as bytes,
 * 's' the rest as a string (no NUL, at most GWR_MAX_NAME bytes).
 *
 * The client's first frame is GWR_OP_HELLO {i magic, i version}; the worker
 * answers with a reply {i version} or closes the connection.
 *
 * Handing over: the agent that serves the client's socket reads its hello
 * first. If it carries GWR_F_HANDOVER and the session is admitted on the
 * direct path, the agent answers with GWR_OP_HANDOVER instead, the
 * session's TCP socket attached (SCM_RIGHTS), and the server's agent sends
 * the same frame to the worker as the first on its socket. Both ends then
 * carry on the session's TLS 1.3 connection themselves (tls13.h): the
 * client says hello again over it, and the agents' sockets stay open only
 * as their handle on the session. The payload is {u32 suite, u64 write
 * seq, u64 read seq, 32-byte write secret, 32-byte read secret}, the
 * receiver's own view. */
#ifndef GPUWARDEN_REMOTE_PROTO_H
#define GPUWARDEN_REMOTE_PROTO_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the remote protocol is little-endian and encoded by copying: port gwr_put/gwr_get first"
#endif

#define GWR_MAGIC 0x31525747u /* "GWR1" */
#define GWR_VERSION 1u

#define GWR_HDR_SIZE 24
#define GWR_CHUNK (1u << 20)                  /* bulk data per frame */
#define GWR_MAX_PAYLOAD (GWR_CHUNK + 4096u)   /* a chunk and its fields */
#define GWR_MAX_NAME 1023u                    /* strings: kernel names, NVML ids */
#define GWR_MAX_PARAM_BYTES 32764u            /* NVIDIA's limit on a launch's parameters */
#define GWR_MAX_PARAMS 1024u
#define GWR_MAX_ATTRS 16u                     /* cuLaunchKernelEx attributes */
#define GWR_ATTR_SIZE 72u                     /* sizeof(CUlaunchAttribute) */
#define GWR_MAX_IMAGE (256u << 20)            /* a module image */
#define GWR_MAX_SESSION_IMAGES (1024u << 20)  /* all images one session uploads */
#define GWR_MAX_FIELDS 12

#define GWR_SOCKET_BUFFER (4 << 20) /* asked of both ends (capped by net.core.wmem_max): bulk copies stream */

#define GWR_F_SYNC 0x1u
#define GWR_F_HANDOVER 0x2u /* on the client's hello: it takes a handed-over connection */

/* A reply's payload: {i result, then the op's outputs}. A reply to a
 * synchronizing op (GWR_F_SYNCPOINT in gwr_op_flags) carries the first
 * error of an earlier asynchronous frame, if any, instead of its own. */
#define GWR_NEED_IMAGE 0x7fff0001u /* GWR_OP_MODULE_LOAD: send the image first */

/* X(name, value, request format) */
#define GWR_OPS(X)                                                                                 \
    X(HELLO, 1, "ii")                                                                              \
    X(REPLY, 2, "ib")            /* worker: {i result, b outputs} */                               \
    X(DATA, 3, "qb")             /* worker: {q offset, b bytes} of a reply's bulk data */          \
    X(HANDOVER, 4, "iqqb")       /* agent: {suite, write seq, read seq, b secrets}, a socket attached */ \
    X(DATA_RING, 5, "qii")       /* worker: {offset, ring slot, bytes} of a reply's bulk data (ring.h) */ \
    X(INIT, 10, "i")                                                                               \
    X(DEVICE_GET, 11, "i")       /* -> i device */                                                 \
    X(DEVICE_COUNT, 12, "")      /* -> i count */                                                  \
    X(DEVICE_NAME, 13, "ii")     /* {dev, len} -> b name */                                        \
    X(DEVICE_UUID, 14, "ii")     /* {dev, v2} -> b 16 bytes */                                     \
    X(DEVICE_TOTALMEM, 15, "i")  /* -> q bytes */                                                  \
    X(DEVICE_ATTR, 16, "ii")     /* {attr, dev} -> i value */                                      \
    X(DEVICE_POOL, 17, "qi")     /* {pool handle, dev} */                                          \
    X(PRIMARY_RETAIN, 20, "qi")  /* {ctx handle, dev} */                                           \
    X(PRIMARY_RELEASE, 21, "qi") /* {ctx handle, dev} */                                           \
    X(CTX_CREATE, 22, "qii")     /* {ctx handle, flags, dev} */                                    \
    X(CTX_DESTROY, 23, "q")                                                                        \
    X(CTX_SYNC, 24, "")                                                                            \
    X(MEM_ALLOC, 30, "q")        /* {bytes} -> q dptr */                                           \
    X(MEM_ALLOC_PITCH, 31, "qqi") /* {width, height, elem} -> q dptr, q pitch */                   \
    X(MEM_FREE, 32, "q")                                                                           \
    X(MEM_INFO, 33, "")          /* -> q free, q total */                                          \
    X(MEM_ALLOC_ASYNC, 34, "qqqi") /* {bytes, stream, pool or 0, ptsz} -> q dptr */                \
    X(MEM_FREE_ASYNC, 35, "qqi") /* {dptr, stream, ptsz} */                                        \
    X(POOL_CREATE, 36, "qb")     /* {pool handle, b CUmemPoolProps} */                             \
    X(POOL_DESTROY, 37, "q")                                                                       \
    X(MEM_GRANULARITY, 38, "ib") /* {option, b CUmemAllocationProp} -> q granularity */            \
    X(MEM_CREATE, 39, "qqqb")    /* {allocation handle, size, flags, b prop} */                    \
    X(MEM_RELEASE, 40, "q")                                                                        \
    X(MEM_RESERVE, 41, "qqqq")   /* {size, alignment, addr, flags} -> q dptr */                    \
    X(MEM_ADDR_FREE, 42, "qq")                                                                     \
    X(MEM_MAP, 43, "qqqqq")      /* {dptr, size, offset, allocation handle, flags} */              \
    X(MEM_UNMAP, 44, "qq")                                                                         \
    X(MEM_SET_ACCESS, 45, "qqb") /* {dptr, size, b CUmemAccessDesc[]} */                           \
    X(HTOD, 46, "qb")            /* {dst, b bytes}: one chunk */                                   \
    X(DTOH, 47, "qq")            /* {src, bytes} -> DATA frames, then the reply */                 \
    X(MEMSET8, 48, "qqi")        /* {dst, count, value} */                                         \
    X(RING, 49, "ii")            /* {slots, slot bytes}, a sealed memfd attached (ring.h) */       \
    X(MODULE_LOAD, 50, "qhq")    /* {module handle, image hash, image size} */                     \
    X(IMAGE_CHUNK, 51, "hqqb")   /* {image hash, image size, offset, b bytes} */                   \
    X(MODULE_FUNCTION, 52, "qqs") /* {function handle, module handle, name} */                     \
    X(MODULE_UNLOAD, 53, "q")                                                                      \
    X(FUNC_PARAMS, 54, "q")      /* {function} -> i n, then n x {i offset, i size} */              \
    X(LAUNCH, 55, "qqiiiiiiiiiib")                                                                 \
    /* {function, stream, grid x3, block x3, shared mem, kind, attrs, has params,                  \
        b attrs (attrs x GWR_ATTR_SIZE) then the packed parameter buffer} */                       \
    X(HTOD_RING, 56, "qii")      /* {dst, ring slot, bytes}: one chunk (ring.h) */                 \
    X(STREAM_CREATE, 60, "qi")   /* {stream handle, flags} */                                      \
    X(STREAM_DESTROY, 61, "q")                                                                     \
    X(STREAM_SYNC, 62, "q")                                                                        \
    X(STREAM_QUERY, 63, "q")                                                                       \
    X(EVENT_CREATE, 64, "qi")    /* {event handle, flags} */                                       \
    X(EVENT_RECORD, 65, "qq")    /* {event, stream} */                                             \
    X(EVENT_QUERY, 66, "q")                                                                        \
    X(EVENT_SYNC, 67, "q")                                                                         \
    X(EVENT_ELAPSED, 68, "qq")   /* -> b float */                                                  \
    X(EVENT_DESTROY, 69, "q")                                                                      \
    X(CAPTURE_BEGIN, 70, "qi")   /* {stream, mode} */                                              \
    X(CAPTURE_END, 71, "qq")     /* {stream, graph handle} */                                      \
    X(GRAPH_INSTANTIATE, 72, "qqq") /* {exec handle, graph, flags} */                              \
    X(GRAPH_LAUNCH, 73, "qqi")   /* {exec, stream, ptsz} */                                        \
    X(GRAPH_DESTROY, 74, "q")                                                                      \
    X(GRAPH_EXEC_DESTROY, 75, "q")                                                                 \
    X(NVML, 80, "iiiqs")         /* {GWR_NVML_*, device index, arg, arg64, string} -> b outputs */

enum gwr_op {
#define GWR_OP_ENUM(name, value, fmt) GWR_OP_##name = value,
    GWR_OPS(GWR_OP_ENUM)
#undef GWR_OP_ENUM
    GWR_OP_MAX = 96
};

/* Launch kinds: which entry point the client was called through. */
enum gwr_launch_kind {
    GWR_LAUNCH_PLAIN = 0,
    GWR_LAUNCH_PTSZ = 1,
    GWR_LAUNCH_COOPERATIVE = 2,
    GWR_LAUNCH_COOPERATIVE_PTSZ = 3,
    GWR_LAUNCH_EX = 4,
    GWR_LAUNCH_EX_PTSZ = 5,
};

/* NVML calls, forwarded to the worker's libnvidia-ml.so.1. */
enum gwr_nvml {
    GWR_NVML_INIT = 1,            /* arg: flags */
    GWR_NVML_SHUTDOWN,
    GWR_NVML_DRIVER_VERSION,      /* arg: length -> b string */
    GWR_NVML_NVML_VERSION,        /* arg: length -> b string */
    GWR_NVML_CUDA_VERSION,        /* -> i version */
    GWR_NVML_COUNT,               /* -> i count */
    GWR_NVML_BY_INDEX,            /* index -> i index */
    GWR_NVML_BY_UUID,             /* string -> i index */
    GWR_NVML_BY_PCI,              /* string -> i index */
    GWR_NVML_NAME,                /* arg: length -> b string */
    GWR_NVML_UUID,                /* arg: length -> b string */
    GWR_NVML_PCI,                 /* -> b nvmlPciInfo_t */
    GWR_NVML_MINOR,               /* -> i minor */
    GWR_NVML_MEMORY,              /* -> b nvmlMemory_t */
    GWR_NVML_MEMORY_V2,           /* arg: version -> b nvmlMemory_v2_t */
    GWR_NVML_UTILIZATION,         /* -> b nvmlUtilization_t */
    GWR_NVML_PROCESSES,           /* arg: version (1..3), arg64: count, 0 asks -> i count, b infos */
    GWR_NVML_PROCESS_UTILIZATION, /* arg: count, arg64: last seen -> i count, b samples */
};

/* A decoded frame: its header, and its payload's fields in order. */
struct gwr_hdr {
    uint32_t len;
    uint16_t op, flags;
    uint32_t seq;
    uint64_t ctx;
};

struct gwr_req {
    struct gwr_hdr h;
    uint64_t q[GWR_MAX_FIELDS];
    uint32_t i[GWR_MAX_FIELDS];
    const uint8_t *hash;    /* 'h' */
    const uint8_t *data;    /* 'b' */
    size_t ndata;
    char str[GWR_MAX_NAME + 1]; /* 's', NUL-terminated */
};

/* decode.c: bounds-checked decoding, for the worker and the client's reader. */
void gwr_put_hdr(uint8_t out[GWR_HDR_SIZE], const struct gwr_hdr *h);
int gwr_get_hdr(const uint8_t in[GWR_HDR_SIZE], struct gwr_hdr *h); /* 0, or -1: bad header */
const char *gwr_format(uint16_t op);                                 /* NULL: no such op */
int gwr_decode(const struct gwr_hdr *h, const uint8_t *payload, struct gwr_req *r); /* 0 or -1 */
/* gwr_encode writes fields by format from the arguments (uint64_t for 'q',
 * uint32_t for 'i', const uint8_t * for 'h'; 'b' and 's' are sent after
 * these by the caller); returns the bytes written, or 0 if cap is short. */
size_t gwr_encode(uint8_t *out, size_t cap, const char *fmt, ...);
size_t gwr_vencode(uint8_t *out, size_t cap, const char *fmt, va_list ap);

/* sha256.c */
#define GWR_HASH_SIZE 32
void gwr_sha256(const void *data, size_t n, uint8_t out[GWR_HASH_SIZE]);

#endif
