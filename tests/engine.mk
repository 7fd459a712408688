# The engine: the master equivalence test (stateful vs stateless serving),
# suspension and bad input.
check_PROGRAMS += tests/test-engine
TESTS += tests/test-engine
tests_test_engine_SOURCES = tests/test-engine.c tests/engine-util.h tests/delay-backend.c
tests_test_engine_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_LDADD = $(PV_LINK) $(PTHREAD_LIBS)

# The layer-pipelined swap-in, on the delay backend.
check_PROGRAMS += tests/test-engine-pipeline
TESTS += tests/test-engine-pipeline
tests_test_engine_pipeline_SOURCES = tests/test-engine-pipeline.c tests/engine-util.h tests/delay-backend.c
tests_test_engine_pipeline_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_pipeline_LDADD = $(PV_LINK) $(PTHREAD_LIBS)

# Whole-conversation turns (common prefix kept, divergence truncated in
# every tier), cancellation, NULL sessions and the engine loop's thread.
check_PROGRAMS += tests/test-engine-share
TESTS += tests/test-engine-share
tests_test_engine_share_SOURCES = tests/test-engine-share.c tests/engine-util.h
tests_test_engine_share_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_share_LDADD = $(PV_LINK)
check_PROGRAMS += tests/test-engine-conversation
TESTS += tests/test-engine-conversation
tests_test_engine_conversation_SOURCES = tests/test-engine-conversation.c tests/engine-util.h
tests_test_engine_conversation_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_conversation_LDADD = $(PV_LINK) $(PTHREAD_LIBS)

# Chained decode steps (decode_steps > 1) give decode_steps 1's turns.
check_PROGRAMS += tests/test-engine-chain
TESTS += tests/test-engine-chain
tests_test_engine_chain_SOURCES = tests/test-engine-chain.c tests/engine-util.h
tests_test_engine_chain_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_chain_LDADD = $(PV_LINK)

# Sessions that outlive the engine: restart equivalence, refused files,
# kill -9 during saves, the size limit, the background saver.
check_PROGRAMS += tests/test-engine-state
TESTS += tests/test-engine-state
tests_test_engine_state_SOURCES = tests/test-engine-state.c tests/engine-util.h
tests_test_engine_state_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_state_LDADD = $(PV_LINK) $(PTHREAD_LIBS)

# Logit bias: greedy turns against a brute-force reference, bans, forced
# tokens, concurrent turns with different lists, modes and chained steps,
# the submit-time refusals.
check_PROGRAMS += tests/test-engine-bias
TESTS += tests/test-engine-bias
tests_test_engine_bias_SOURCES = tests/test-engine-bias.c tests/engine-util.h
tests_test_engine_bias_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_engine_bias_LDADD = $(PV_LINK)
