/* kernels_swin.h - the CPU backend's kernels of the Swin Transformer's
 * operators (stdlib/ops.plan): patches of an image, windows with a cyclic
 * shift, window attention with a relative position bias and the mask of
 * shifted windows, patch merging and mean pooling. The conventions are
 * kernels.h's: f32 row-major packed parts, outputs first, gradient outputs
 * may be NULL, `acc` adds instead of overwriting. */
#ifndef WEFT_KERNELS_SWIN_H
#define WEFT_KERNELS_SWIN_H

#include <stdbool.h>
#include <stdint.h>

/* Patches of p x p pixels (a convolution of stride p as a reshape before a
 * matrix product): x[b][c][hn p][wn p] -> out[b][hn][wn][c p p], element
 * (ch, u, v) of a patch at ((ch p) + u) p + v, as torch flattens a Conv2d
 * weight [out, c, p, p]. */
void k_patchify(float *out, const float *x, int64_t b, int64_t c, int64_t hn, int64_t wn, int64_t p);
void k_patchify_backward(float *dx, const float *dout, int64_t b, int64_t c, int64_t hn, int64_t wn,
                         int64_t p, bool acc);

/* Windows of ws x ws tokens after a cyclic shift: x[b][h][w][c] with h =
 * hn ws, w = wn ws; out[b][i][j][u ws + v][c] = x[b][(i ws + u + shift) mod
 * h][(j ws + v + shift) mod w][c] (torch.roll by -shift, then the windows
 * in row-major order). */
void k_window_partition(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                        int64_t c, int64_t shift);
/* dx: the inverse permutation of dout. */
void k_window_partition_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn,
                                 int64_t ws, int64_t c, int64_t shift, bool acc);
/* The inverse of k_window_partition: windows back into the image and the
 * shift undone (torch.roll by +shift). */
void k_window_reverse(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t ws,
                      int64_t c, int64_t shift);
void k_window_reverse_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn,
                               int64_t ws, int64_t c, int64_t shift, bool acc);

/* Window attention (Swin, Liu et al. 2021): qkv[b][hn][wn][s][3 heads dh],
 * s = ws ws tokens per window, laid out (3, heads, dh) like
 * k_causal_attention's; out[b][hn][wn][s][heads dh]. Per window and head:
 * softmax(q k^T / sqrt(dh) + bias) v, bias[i][j] = table[idx(i, j)][head]
 * with table[(2 ws - 1)^2][heads] and idx(i, j) = (ui - uj + ws - 1)(2 ws
 * - 1) + (vi - vj + ws - 1) for tokens at (u, v) of the window. With a
 * shift, a window of the shifted image that wraps around holds tokens of
 * up to four regions of the image (rows below h - ws, below h - shift, the
 * rest; columns alike) and a token attends only to tokens of its own region
 * (the original adds -100 to the other scores; here they get no weight).
 * The part holds windows hn0.. and wn0.. of a grid of hn_all x wn_all. */
typedef struct swin_attn_dims {
  int64_t b, hn, wn, ws, heads, dh;
  int64_t hn0, wn0, hn_all, wn_all, shift;
} swin_attn_dims;

void k_window_attention(float *out, const float *qkv, const float *table, const swin_attn_dims *z);
/* dqkv and dtable (the bias's gradient summed over the windows and the
 * batch), the probabilities recomputed. */
void k_window_attention_backward(float *dqkv, float *dtable, const float *dout, const float *qkv,
                                 const float *table, const swin_attn_dims *z, bool acc);

/* Patch merging: the 2 x 2 neighbours of x[b][2 hn][2 wn][c] side by side,
 * out[b][i][j][q c + ch] with q = 0: (2i, 2j), 1: (2i + 1, 2j), 2: (2i,
 * 2j + 1), 3: (2i + 1, 2j + 1), the order of Swin's torch.cat. */
void k_patch_merge(float *out, const float *x, int64_t b, int64_t hn, int64_t wn, int64_t c);
void k_patch_merge_backward(float *dx, const float *dout, int64_t b, int64_t hn, int64_t wn, int64_t c,
                            bool acc);

/* out[b][c] (+)= sum over h, w of x[b][h][w][c] / count: the mean over the
 * tokens when count = h w; a part of the tokens gives a partial sum when
 * count is the whole image's. */
void k_mean_pool(float *out, const float *x, int64_t b, int64_t hw, int64_t c, int64_t count, bool acc);
void k_mean_pool_backward(float *dx, const float *dout, int64_t b, int64_t hw, int64_t c, int64_t count,
                          bool acc);

#endif
