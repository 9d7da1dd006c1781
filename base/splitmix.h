/*
 * base/splitmix.h — splitmix64 (Steele, Lea, Flood 2014), the one copy:
 * tiny, full period, the same stream on every machine, so that
 * initialisation, shuffles and synthetic data reproduce exactly (libc
 * rand() is neither portable nor reproducible).
 */
#ifndef LOOM_BASE_SPLITMIX_H
#define LOOM_BASE_SPLITMIX_H

#include <stdint.h>

/* Advances *state and returns the next 64 random bits. */
static inline uint64_t loom_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#endif /* LOOM_BASE_SPLITMIX_H */
