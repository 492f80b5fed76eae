/* ccl.h - the CUDA backend's collective communication on NCCL, behind a
 * plain C header: communicators made non-blocking (NCCL's config
 * blocking = 0), so that no call holds the host thread and every wait is
 * polled against the run's timeout; collectives and sends enqueued on a
 * stream. The emulation (WEFT_CUDA_EMU) has a stand-in whose ranks are
 * processes of one machine that meet through files in a directory the id
 * names, its operations work of the emulated stream that waits for the
 * other processes' files; a build without nccl.h (WEFT_NO_NCCL) has none,
 * and ccl_init says so. */
#ifndef WEFT_CUDA_CCL_H
#define WEFT_CUDA_CCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CCL_ID_BYTES = 128 };
/* Beside gpu_dtype's types: doubles (the loss's shares, the norm's sums) and bytes (messages). */
enum { CCL_F64 = 16, CCL_U8 = 17 };
/* What an all-reduce takes of its members' elements. */
enum { CCL_SUM = 0, CCL_MAX = 1 };

typedef struct ccl_comm ccl_comm;

/* What this build communicates with, for people ("NCCL 2.28.3"); false
 * with why there is none. */
bool ccl_available(char *buf, size_t n);
/* A new communicator's id (ncclGetUniqueId), made by one process and
 * shared with the others (rendezvous.h). */
bool ccl_unique_id(unsigned char id[CCL_ID_BYTES], char *err, size_t errlen);
/* Joins the communicator of id as rank of nranks on the current GPU,
 * waiting at most timeout_s (0: no limit) for the others. */
ccl_comm *ccl_init(const unsigned char id[CCL_ID_BYTES], int nranks, int rank, double timeout_s, char *err,
                   size_t errlen);
/* Every rank of parent calls it: the ranks of one color (>= 0) get a
 * communicator of their own in *out, ordered by key; color -1: none
 * (*out NULL). */
bool ccl_split(ccl_comm *parent, int color, int key, double timeout_s, ccl_comm **out, char *err, size_t errlen);
int ccl_rank(const ccl_comm *c);
int ccl_size(const ccl_comm *c);

/* Operations between ccl_group_start and ccl_group_end are posted
 * together (sends and receives that must progress at once, a bucket's
 * collectives); ccl_group_end waits at most timeout_s for c to take them. */
void ccl_group_start(void);
bool ccl_group_end(ccl_comm *c, double timeout_s, char *err, size_t errlen);

/* Enqueued on s; count elements of dt (gpu_dtype), sums in that type.
 * In place when src is dst (for reduce-scatter and all-gather: dst's
 * rank-th part). False with a message when NCCL refuses them. */
bool ccl_all_reduce(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, gpu_stream *s, char *err,
                    size_t errlen);
/* The same with op (CCL_SUM, CCL_MAX). */
bool ccl_all_reduce_op(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int op, gpu_stream *s,
                       char *err, size_t errlen);
bool ccl_reduce_scatter(ccl_comm *c, const void *src, void *dst, int64_t recv_count, int dt, gpu_stream *s,
                        char *err, size_t errlen);
bool ccl_all_gather(ccl_comm *c, const void *src, void *dst, int64_t send_count, int dt, gpu_stream *s, char *err,
                    size_t errlen);
bool ccl_broadcast(ccl_comm *c, const void *src, void *dst, int64_t count, int dt, int root, gpu_stream *s,
                   char *err, size_t errlen);
bool ccl_send(ccl_comm *c, const void *src, int64_t count, int dt, int peer, gpu_stream *s, char *err,
              size_t errlen);
bool ccl_recv(ccl_comm *c, void *dst, int64_t count, int dt, int peer, gpu_stream *s, char *err, size_t errlen);

/* The communicator's state (ncclCommGetAsyncError): 0 fine, 1 still
 * taking an operation, -1 failed (err says how). */
int ccl_status(ccl_comm *c, char *err, size_t errlen);
/* Ends c at once, whatever it was doing (ncclCommAbort), and frees it. */
void ccl_abort(ccl_comm *c);
/* Ends c once its operations are done (finalized, then destroyed). */
void ccl_free(ccl_comm *c, double timeout_s);

#ifdef __cplusplus
}
#endif

#endif
