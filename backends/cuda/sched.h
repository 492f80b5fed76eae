/* sched.h - the CUDA backend's plan of a step, made once when a program is
 * opened: the order in which one host thread enqueues the instructions of
 * every virtual device on its stream, the events that order the streams
 * where data crosses between devices, and where every buffer, message and
 * scratch area lies in each device's pool.
 *
 * The order is the programs' own, interleaved as weft's deadlock check
 * walks them (lower.h): a send posts and goes on, a receive waits for it,
 * a broadcast's root posts, every other collective waits until all its
 * members arrive. A send packs its region into a message in the sender's
 * pool; the receiver's stream waits for the packing and unpacks it. A
 * collective's members pack what they bring into messages; once all have
 * arrived, each member's stream waits for the others' packing and reduces
 * or gathers from every message in group order. A message is freed when
 * its readers have been enqueued, with their events: memory of a pool that
 * another stream read is reused only after a wait for those reads. */
#ifndef WEFT_CUDA_SCHED_H
#define WEFT_CUDA_SCHED_H

#include "cuda/cx.h"

typedef enum {
  SO_ZERO,      /* arg: a buffer its alloc clears */
  SO_INPUT,     /* arg: a buffer its alloc fills from the model input */
  SO_INS,       /* ins: a compute, copy or step; ws: its scratch */
  SO_SEND,      /* ins: packs in[0] into message arg */
  SO_RECV,      /* ins: unpacks message arg into out[0] */
  SO_PACK,      /* ins: member `member` of collective arg packs what it brings */
  SO_REDUCE,    /* ins: member `member` of collective arg takes its result */
  SO_RECORD,    /* arg: an event, recorded on dev's stream */
  SO_WAIT,      /* arg: an event dev's stream waits for */
  SO_NORM_PART, /* ins: a step whose gradient counts in the norm, counted before the steps run */
  SO_NORM,      /* the clipping factor from every device's count */
  SO_KIND_COUNT
} sop_kind;

typedef struct sop {
  uint8_t kind;
  int dev;                /* the plan device whose stream runs it */
  int ins;                /* its instruction in dev's program, -1 none */
  int arg;
  int member;
  int64_t ws;             /* SO_INS: offset of its scratch in dev's pool, -1 none */
} sop;

/* A message: bytes in the pool of the device that packs it. */
typedef struct smsg {
  int dev;
  int64_t off, bytes;
} smsg;

/* One meeting of a collective's members. */
typedef struct scoll {
  int comm, epoch;
  int n;                  /* members, in group order */
  int *dev, *ins;         /* each member's device and instruction (-1 until it arrives) */
  int *msg;               /* each member's message, -1 when it brings none */
  int *pack_ev, *done_ev; /* each member's events: its packing, its taking (-1 none) */
  int *fence;             /* scratch: the events its messages are freed with */
  int root;               /* a broadcast: the member that brings the data, -1 until it comes */
  int arrived, taken;
  bool done;
} scoll;

/* A message's entries: what it holds, one region after another (each
 * aligned), as the packing instruction reads them: an all-reduce's region
 * (a bucket's, one each), a reduce-scatter's parts in group order, an
 * all-gather's member's part, a broadcast's region, an all-to-all's
 * pieces for each member. */
enum { SCHED_MAX_ENTRIES = 1 << 16 };
typedef struct sentry {
  int64_t off;            /* bytes from the message's start */
  int dt;                 /* gpu_dtype */
  tregion region;         /* its region of the tensor */
  bool owned;             /* an all-to-all's piece, freed by sched_entries_free */
} sentry;

typedef struct csched {
  const weft_program *pr;
  sop *ops;
  int nops, cap;
  smsg *msgs;
  int nmsgs, mcap;
  scoll *colls;
  int ncolls, ccap;
  int nevents;
  int64_t *off;           /* per buffer: offset in its device's pool, -1 none */
  int64_t *fixed;         /* per device: offset of the area every device keeps (cuBLASLt's workspace) */
  int64_t *persistent;    /* per device: bytes that live across steps (and the fixed area) */
  int64_t *pool;          /* per device: its pool's bytes */
  int64_t **keep_off;     /* per device, per instruction: the offset of the area a
                           * forward keeps for its backward (ckeep), on both; -1 none */
} csched;

/* What a forward compute keeps for the backward of the same part (the
 * attention's per-row statistics): `bytes` of the pool from the forward
 * until its backward `pair` has run, and the buffer of the forward's result
 * (`hold`, -1 none) held until then too, past its free. On the backward:
 * bytes 0 and `pair` its forward. pair -1: nothing kept. */
typedef struct ckeep {
  int64_t bytes;
  int pair, hold;
} ckeep;

/* What the plan asks of its caller. */
typedef struct csched_cb {
  void *ctx;
  /* Scratch bytes of instruction `ins` of dev's program (a compute, copy or
   * step): the temporaries of its parts and its kernels' workspace. */
  int64_t (*ins_ws)(void *ctx, int dev, int ins);
  int64_t fixed;          /* bytes every device keeps apart */
  const ckeep *const *keep; /* per device, per instruction; NULL: nothing kept */
  const int64_t *bytes;   /* per buffer: its bytes in its pool where not lbuf.bytes (0), its rows
                           * padded; NULL: none */
  const int *share;       /* per buffer: the buffer of the same device whose memory it takes
                           * (allocated before it; the memory is released when both are
                           * freed), -1 its own; NULL: none shares */
} csched_cb;

/* The plan; false with a message (programs that do not meet, a region
 * outside its buffer). tail (NULL: none) splits each device's program for
 * clipping (backends/cpu/clip.h, clip_tail): every device runs its
 * instructions before the norm, then counts the gradients of its steps
 * after it (SO_NORM_PART) and records an event; the first device with a
 * program waits for them all and takes the factor (SO_NORM); every device
 * waits for that, then runs the rest. The offsets of persistent buffers do
 * not depend on tail. */
bool sched_build(csched *s, const weft_program *pr, const csched_cb *cb, bool *const *tail, char *err,
                 size_t errlen);
void sched_free(csched *s);

/* The entries of the message member `rank` of instruction `in` packs
 * (in->kind LI_SEND or LI_COLLECTIVE); returns their count (0: it brings
 * none) and the message's bytes in *bytes. */
int sched_entries(const weft_program *pr, const lins *in, int rank, sentry *e, int max, int64_t *bytes);
void sched_entries_free(sentry *e, int n);
/* The rank of device dev in comm's group, -1 none. */
int sched_rank(const pcomm *cm, int dev);

#endif
