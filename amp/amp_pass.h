/*
 * amp/amp_pass.h — the mixed-precision pass run by loom_compile before
 * autodiff, and the policy questions the engine asks of the AMP options.
 */
#ifndef LOOM_AMP_PASS_H
#define LOOM_AMP_PASS_H

#include <stddef.h>

#include "graph/graph_internal.h"

/* Refuses combinations that make no sense (as apex does), with a message. */
loom_status loom_amp_check(const loom_amp_opts *o, char *err, size_t errlen);

/* Rewrites g's forward graph for o->level; *loss is updated to the loss of
 * the rewritten graph (always f32 or f64). O0 leaves g untouched. With
 * masters 0, O2's half parameters get no fp32 master (a forward-only plan
 * has no optimizer to own one). */
loom_status loom_amp_pass(loom_graph *g, loom_value *loss, const loom_amp_opts *o, int masters,
			  char *err, size_t errlen);

/* Whether the gradients are scaled (O1/O2 with fp16, or a static scale). */
int loom_amp_uses_scaling(const loom_amp_opts *o);

/* amp.fp8's recipe with the default resolved (LOOM_FP8_SCALING_CURRENT or
 * _DELAYED), and delayed scaling's history length (0: the default). */
loom_fp8_scaling loom_fp8_recipe(const loom_amp_opts *o);
int loom_fp8_history(const loom_amp_opts *o);

#endif /* LOOM_AMP_PASS_H */
