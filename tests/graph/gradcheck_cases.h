/*
 * tests/graph/gradcheck_cases.h — the gradient checks of
 * tests/graph/test_gradcheck.c, one row per case: the op whose gradient
 * rule it checks (LOOM_OP_COUNT: a whole model, no one op) and its name.
 * test_gradcheck.c turns each row into the Test that runs case_<name>, so a
 * row without a case does not compile; tests/graph/test_op_table.c reads
 * the ops, so an op without a row fails there. The unary ops of
 * graph/unary.h have a check each from their own rows (test_gradcheck.c's
 * unary_case), which test_op_table.c counts too.
 */
#ifndef LOOM_TESTS_GRAPH_GRADCHECK_CASES_H
#define LOOM_TESTS_GRAPH_GRADCHECK_CASES_H

#define LOOM_GRADCHECK_CASES(X)                                          \
	X(LOOM_OP_CONV2D, conv2d_3x3_pad0_bias_batch1)                   \
	X(LOOM_OP_CONV2D, conv2d_3x3_pad1_nobias_nonsquare_batch3)       \
	X(LOOM_OP_CONV2D, conv2d_3x3_stride2_pad1_bias)                  \
	X(LOOM_OP_CONV2D, conv2d_5x5_pad2_bias)                          \
	X(LOOM_OP_CONV2D, conv2d_2x2_stride2_pad0_nobias)                \
	X(LOOM_OP_CONV2D, conv2d_1x1_bias)                               \
	X(LOOM_OP_CONV2D, conv2d_stride2_pad2_nonsquare_batch3)          \
	X(LOOM_OP_CONV2D, conv2d_nonsquare_kernel)                       \
	X(LOOM_OP_BATCHNORM2D, batchnorm2d_train)                        \
	X(LOOM_OP_BATCHNORM2D, batchnorm2d_train_batch1)                 \
	X(LOOM_OP_BATCHNORM2D, batchnorm2d_sum_is_invariant)             \
	X(LOOM_OP_GLOBAL_AVGPOOL, global_avgpool)                        \
	X(LOOM_OP_RELU, relu)                                            \
	X(LOOM_OP_RELU, relu_2d)                                         \
	X(LOOM_OP_GELU, gelu_tanh)                                       \
	X(LOOM_OP_MAXPOOL2D, maxpool2d_k2_s2)                            \
	X(LOOM_OP_MAXPOOL2D, maxpool2d_k2_s2_odd)                        \
	X(LOOM_OP_MAXPOOL2D, maxpool2d_k3_s2_pad1)                       \
	X(LOOM_OP_MAXPOOL2D, maxpool2d_k3_s2_pad1_nonsquare)             \
	X(LOOM_OP_LINEAR, linear_bias)                                   \
	X(LOOM_OP_LINEAR, linear_nobias)                                 \
	X(LOOM_OP_MATMUL, matmul)                                        \
	X(LOOM_OP_MATMUL, matmul_square_self)                            \
	X(LOOM_OP_ADD, add)                                              \
	X(LOOM_OP_ADD, add_same_value_twice)                             \
	X(LOOM_OP_ADD, add_intermediate_twice)                           \
	X(LOOM_OP_RESHAPE, reshape_then_linear)                          \
	X(LOOM_OP_RESHAPE, flatten_then_linear)                          \
	X(LOOM_OP_SUM, sum)                                              \
	X(LOOM_OP_BROADCAST, mean)                                       \
	X(LOOM_OP_BROADCAST, sum_and_mean_exact)                         \
	X(LOOM_OP_SOFTMAX_CE, softmax_cross_entropy)                     \
	X(LOOM_OP_SOFTMAX_CE, softmax_cross_entropy_flattened)           \
	X(LOOM_OP_SOFTMAX_CE, softmax_cross_entropy_large_logits)        \
	X(LOOM_OP_COUNT, convnet)                                        \
	X(LOOM_OP_COUNT, residual_block)                                 \
	X(LOOM_OP_CAST, cast_through_f32)                                \
	X(LOOM_OP_CAST, cast_through_f16)                                \
	X(LOOM_OP_CAST, cast_through_bf16)                               \
	X(LOOM_OP_EMBEDDING, embedding_repeated_ids)                     \
	X(LOOM_OP_EMBEDDING, embedding_tied_output)                      \
	X(LOOM_OP_LAYERNORM, layernorm_3d)                               \
	X(LOOM_OP_LAYERNORM, layernorm_2d_narrow)                        \
	X(LOOM_OP_LINEAR, linear_3d_bias)                                \
	X(LOOM_OP_ATTENTION, attention_t1)                               \
	X(LOOM_OP_ATTENTION, attention_t4_h1)                            \
	X(LOOM_OP_ATTENTION, attention_t5_h3)                            \
	X(LOOM_OP_ATTENTION, attention_free_probs)                       \
	X(LOOM_OP_ATTN_PROBS, attn_probs_t4_h2)                          \
	X(LOOM_OP_RMSNORM, rms_norm_3d)                                  \
	X(LOOM_OP_RMSNORM, rms_norm_2d_narrow)                           \
	X(LOOM_OP_FP8_QDQ, fp8_qdq_grad_e5m2)                            \
	X(LOOM_OP_FP8_QDQ, fp8_qdq_e4m3_straight_through)

#endif /* LOOM_TESTS_GRAPH_GRADCHECK_CASES_H */
