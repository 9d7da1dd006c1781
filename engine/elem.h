/*
 * engine/elem.h — the engine's and backends' name for base/elem.h (one
 * element of any dtype as a double), which parallel/ and io/ include
 * directly.
 */
#ifndef LOOM_ENGINE_ELEM_H
#define LOOM_ENGINE_ELEM_H

#include "base/elem.h"

#endif /* LOOM_ENGINE_ELEM_H */
