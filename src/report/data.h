/* data.h - training data for `weft run --data`: files of token ids, cut
 * into sequences and served as batches in a seeded order (docs/run.md,
 * "Data").
 *
 * A file is either llm.c's format, a header of 256 little-endian int32
 * (magic 20240520 with uint16 tokens, or 20240801 with uint32 tokens; a
 * version; the token count) followed by the tokens, or a raw array of
 * little-endian uint16 (nanoGPT's train.bin) or uint32 tokens. A pattern
 * with *, ? or [ names the files it matches (shards), in name order.
 *
 * Each file holds floor((n - 1) / seq) sequences: sequence k is tokens
 * k*seq .. k*seq + seq - 1, and its labels the next tokens, k*seq + 1 ..
 * k*seq + seq. The sequences of all files, numbered file after file, are
 * read in an order that is a fresh seeded permutation each epoch (or in
 * their order, unshuffled); position i of a run is sequence i of that
 * endless order, so a run's place in its data is one number. */
#ifndef WEFT_REPORT_DATA_H
#define WEFT_REPORT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct token_data token_data;

/* Opens the files of pattern and checks them: regular files, a size that
 * fits their format (a whole number of tokens; the count an llm.c header
 * says), at least one sequence among them. raw_bytes (2 or 4) is the
 * token size of files without a header. NULL with "PATH: reason". */
token_data *data_open(const char *pattern, int64_t seq, int raw_bytes, char *err, size_t errlen);
void data_close(token_data *d);

int64_t data_sequences(const token_data *d);
int64_t data_tokens(const token_data *d);
int data_file_count(const token_data *d);
/* "llm.c uint16", "raw uint32", or "mixed" when files differ. */
const char *data_format(const token_data *d);

/* The sequence at position pos of the order: a permutation of all
 * sequences per epoch drawn from seed and the epoch number when shuffled. */
int64_t data_order(token_data *d, int64_t pos, bool shuffle, uint64_t seed);

/* Fills tokens and labels (batch x seq int32 each, row-major) with the
 * sequences at positions pos .. pos + batch - 1. Every id must lie below
 * vocab: else false with the file and the token's index in it. */
bool data_batch(token_data *d, int64_t pos, int64_t batch, bool shuffle, uint64_t seed, int64_t vocab,
                int32_t *tokens, int32_t *labels, char *err, size_t errlen);

#endif
