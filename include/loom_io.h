/*
 * loom_io.h — a program's weights in and out of loom, in the safetensors
 * format (Hugging Face's: what safetensors.torch.save_file writes and
 * load_file reads), under the names PyTorch's state_dict uses, so that a
 * file goes into model.load_state_dict(load_file(path)) and back.
 *
 * What is exchanged: every parameter and buffer of the user's graph (not the
 * optimizer state, not AMP's bookkeeping: loom_save keeps the whole training
 * state). Under O2 a parameter is exported from its fp32 master weight, and
 * an import writes both the master and the half copy.
 */
#ifndef LOOM_IO_H
#define LOOM_IO_H

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One rename of a name's prefix: a loom name that starts with `loom` is
 * called `file` + the rest in the file ("conv1." -> "layer1.0."). */
typedef struct loom_name_map {
	const char *loom;
	const char *file;
} loom_name_map;

typedef struct loom_weights_opts {
	/* 1 (the default): a tensor of the file that the program lacks is an
	 * error, as PyTorch's load_state_dict(strict=True); and so is a
	 * tensor of the program the file lacks. 0: both are counted in the
	 * report and left alone (the program's keeps its initial value). A
	 * tensor of another shape is an error either way, as in PyTorch. */
	int strict;
	/* Prefix renames. Export: the first that matches applies. Import: of
	 * those that match, the first whose result the file holds (so that
	 * two spellings can be offered: GPT-2's "transformer." kept, as
	 * GPT2LMHeadModel's files have it, or dropped, as GPT2Model's); none
	 * held: the first. May be NULL. */
	const loom_name_map *names;
	int n_names;
	/* Import only: tensors (file names) left as the program initialised
	 * them, whatever the file holds: a name equal to a prefix here, or
	 * starting with it and a '.' ("fc" re-initialises fc.weight and
	 * fc.bias, for a classifier of another size). May be NULL. */
	const char *const *skip;
	int n_skip;
	/* Hugging Face's Conv1D (GPT-2's c_attn, c_proj, c_fc): the 2-D
	 * weights named here (file names; an entry matches a name equal to it
	 * or ending in '.' and it) are [out, in] in the program, [in, out] in
	 * such a file. Import: a file holding any of them with its two
	 * dimensions swapped (and unequal) holds all of them so, and each is
	 * transposed as it is read; otherwise they are read as they are.
	 * Export: conv1d_export 1 writes them transposed. May be NULL. */
	const char *const *conv1d;
	int n_conv1d;
	int conv1d_export;
	/* Import only: the file's tensors that are neither read nor
	 * unexpected (matched as conv1d): GPT-2's attn.bias and
	 * attn.masked_bias buffers (the causal mask), an lm_head.weight tied
	 * to the embedding. May be NULL. */
	const char *const *ignore;
	int n_ignore;
	/* Import only: tensors (matched as conv1d) of which the program holds
	 * the file's first rows when the file has more, the other dimensions
	 * equal: GPT-2's wpe (n_positions rows) for a shorter context. May be
	 * NULL. */
	const char *const *first_rows;
	int n_first_rows;
} loom_weights_opts;

/* strict 1, no renames, nothing skipped. */
void loom_weights_opts_default(loom_weights_opts *o);

/* What an import did, PyTorch's missing_keys and unexpected_keys counted;
 * the first of each named (empty when none). */
typedef struct loom_weights_report {
	int loaded;      /* tensors written into the program */
	int missing;     /* the program's, not in the file (strict 0 only) */
	int unexpected;  /* the file's, not in the program (strict 0 only) */
	int skipped;     /* the program's, left by opts.skip */
	char first_missing[96];
	char first_unexpected[96];
	int transposed;  /* of loaded: read from [in, out] (opts.conv1d) */
	int ignored;     /* the file's, left by opts.ignore */
	int first_rows;  /* of loaded: their first rows only (opts.first_rows) */
} loom_weights_report;

/*
 * Writes p's parameters and buffers to path (path.tmp, fsynced, renamed),
 * each in its own dtype (an O2 parameter from its fp32 master), named
 * through opts->names, plus for every batch norm the int64 scalar
 * "<name>.num_batches_tracked" PyTorch keeps (loom's count of training
 * steps, skipped ones included). opts may be NULL. On failure p's error
 * names the file and the fault. Under ZeRO-1 (zero_stage with a group)
 * it is collective, as loom_save: every rank calls it (under O2 each holds
 * a shard of the fp32 masters), rank 0 writes.
 */
loom_status loom_export_safetensors(loom_program *p, const char *path,
				    const loom_weights_opts *opts);

/*
 * Reads path and writes its tensors into p's parameters and buffers of the
 * same (renamed) name, converting F32, F16, BF16 and F64 to the program's
 * dtype (round to nearest even when narrowing). Everything is checked
 * before anything is written: a malformed file (io/safetensors.h lists
 * the faults), a tensor of another shape or a dtype that is not a float,
 * and under strict a missing or unexpected name, are refused naming the
 * tensor, and p is left unchanged. "<bn>.num_batches_tracked" is accepted
 * and not used. report may be NULL. With a process group, every rank that
 * calls it reads the file itself.
 */
loom_status loom_import_safetensors(loom_program *p, const char *path,
				    const loom_weights_opts *opts, loom_weights_report *report);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_IO_H */
