#include <stdio.h>
#include <stdlib.h>
#include "loom.h"
#include "engine/program_internal.h"
int main(void) {
	loom_graph *g; loom_graph_new(&g);
	int64_t xd[2] = {4, 6}, yd[1] = {4};
	loom_value x = loom_input(g, "image", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "label", LOOM_I32, 1, yd);
	loom_value logits = loom_layer_linear(g, "fc", x, 3, 1);
	loom_mark_output(g, logits);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	loom_compile_opts o; loom_compile_opts_default(&o); o.amp.level = atoi(getenv("LVL"));
	loom_program *p;
	if (loom_compile(g, loss, &o, &p)) { printf("compile: %s\n", loom_last_error()); return 1; }
	loom_graph_dump(p->g, stdout); for (int v = 0; v < p->g->n; v++) printf("v%d reg %d off %zu root %d\n", v, p->mp.region[v], p->mp.offset[v], p->mp.root[v]); printf("persist %zu act %zu ws %zu\n", p->mp.persist_bytes, p->mp.act_bytes, p->ws_bytes);
	float img[24]; int32_t lab[4] = {0,1,2,0};
	for (int i = 0; i < 24; i++) img[i] = i * 0.1f;
	loom_set_input(p, "image", img, LOOM_F32, 24); loom_set_input(p, "label", lab, LOOM_I32, 4);
	{ double d[18]; loom_read_f64(p, 2, d, 18); printf("before run: %g %g\n", d[0], d[1]); }
	for (int v = 0; v < p->g->n; v++) { p->be->run_nodes(p, v, v+1, 1); double d[18]; loom_read_f64(p, 2, d, 18); printf("after %d: %g %g\n", v, d[0], d[1]); }
	for (int v = 0; v < p->g->n; v++) if (p->mp.region[v] == LOOM_REGION_PERSIST) {
		int64_t n = loom_shape_numel(&p->g->nodes[v].shape); double d[64];
		if (n > 64 || p->g->nodes[v].dtype == LOOM_I32) continue;
		extern loom_status loom_read_f64(loom_program*, loom_value, double*, size_t);
		loom_read_f64(p, v, d, n); printf("%d:", v); for (int i = 0; i < n && i < 8; i++) printf(" %g", d[i]); printf("\n");
	}
	return 0;
}
