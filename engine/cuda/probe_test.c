#include <stdio.h>
int loom_probe_count(void);
int main(void) { printf("devices %d\n", loom_probe_count()); return 0; }
