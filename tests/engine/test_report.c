/*
 * tests/engine/test_report.c — the plan as Graphviz and the memory report of
 * a compiled ConvNet: every node and edge appears, fused nodes are marked,
 * `dot` parses the output when Graphviz is installed, and the report's
 * figures add up to the arena.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/models.h"
#include "loom.h"
#include "tests/engine/print_text.h"

static loom_program *convnet(loom_opt_level level)
{
	loom_graph *g;
	loom_program *p = NULL;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, 8, &logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	o.amp.level = level;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

static char *slurp(FILE *f)
{
	long n;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	char *s = malloc(n + 1);
	cr_assert_eq(fread(s, 1, n, f), (size_t)n);
	s[n] = 0;
	return s;
}

static int count(const char *s, const char *what)
{
	int n = 0;
	for (const char *q = s; (q = strstr(q, what)); q += strlen(what))
		n++;
	return n;
}

Test(report, dot_has_every_node_and_edge_and_marks_fusion)
{
	loom_program *p = convnet(LOOM_O1);
	loom_program_info info;
	loom_program_info_get(p, &info);
	char path[] = "/tmp/loom_plan_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	FILE *f = fdopen(fd, "w+");
	loom_program_dump_dot(p, f);
	char *s = slurp(f);
	fclose(f);
	cr_assert(strncmp(s, "digraph", 7) == 0);
	/* Node statements are the lines "  n<id> [..." (edges read "  n<a> -> n<b>"). */
	int nodes = 0;
	for (const char *l = s; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0)) {
		int id, used = 0;
		if (sscanf(l, "  n%d [%n", &id, &used) == 1 && used > 0)
			nodes++;
	}
	cr_assert_eq(nodes, info.n_nodes, "node statements: %d", nodes);
	cr_assert_geq(count(s, "relu fused"), 2, "the ConvNet's relu + pool fusions are not marked");
	cr_assert_geq(count(s, "#ffd8a8"), 3, "O1 has fp16 nodes; none is coloured as fp16");
	cr_assert(strstr(s, "conv2d 'conv1'") || strstr(s, "conv1"), "node names missing");
	if (system("command -v dot >/dev/null 2>&1") == 0) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "dot -Tsvg %s -o /dev/null 2>&1", path);
		cr_assert_eq(system(cmd), 0, "dot cannot parse the plan");
	} else {
		cr_log_info("graphviz is not installed: the output was checked, not rendered");
	}
	unlink(path);
	free(s);
	loom_program_free(p);
}

Test(report, memory_report_adds_up_to_the_arena)
{
	loom_program *p = convnet(LOOM_O2);
	loom_program_info info;
	loom_program_info_get(p, &info);
	char *buf = print_text(loom_program_memory_report, p);
	const char *rows[] = { "parameters", "master weights", "gradients", "optimizer state",
			       "activations", "workspace", "peak" };
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_assert(strstr(buf, rows[i]), "no '%s' row in:\n%s", rows[i], buf);
	double peak = -1;
	const char *q = strstr(buf, "peak (the arena)");
	cr_assert(q);
	cr_assert_eq(sscanf(q, "peak (the arena) %lf", &peak), 1, "%s", q);
	cr_assert_float_eq(peak, info.arena_bytes / 1048576.0, 1e-3);
	cr_assert_gt(info.master_bytes, 0, "O2 has fp32 masters");
	free(buf);
	loom_program_free(p);
}

/*
 * The products' FLOPs of a ConvNet step at batch 8, counted by hand:
 * forward conv1 2*16*28*28*(1*5*5), conv2 2*32*14*14*(16*5*5), fc 2*10*1568
 * per image; backward conv1's weight gradient only (the image needs none),
 * conv2's and fc's data and weight gradients.
 */
Test(report, flops_are_the_products_of_forward_and_backward)
{
	loom_program *p = convnet(LOOM_O0);
	loom_program_info info;
	loom_program_info_get(p, &info);
	double conv1 = 2.0 * 16 * 28 * 28 * 25, conv2 = 2.0 * 32 * 14 * 14 * 400, fc = 2.0 * 10 * 1568;
	cr_assert_float_eq(info.flops_fwd, 8 * (conv1 + conv2 + fc), 1.0, "forward %.0f", info.flops_fwd);
	cr_assert_float_eq(info.flops_bwd, 8 * (conv1 + 2 * conv2 + 2 * fc), 1.0, "backward %.0f",
			   info.flops_bwd);
	char *buf = print_text(loom_program_memory_report, p);
	double gf = 0;
	const char *q = strstr(buf, "compute of one step:");
	cr_assert(q, "no compute line in:\n%s", buf);
	cr_assert_eq(sscanf(q, "compute of one step: %lf GFLOP", &gf), 1, "%s", q);
	cr_assert_float_eq(gf, (info.flops_fwd + info.flops_bwd) * 1e-9, 1e-4);
	free(buf);
	loom_program_free(p);
}
