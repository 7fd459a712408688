# pensieve-chat end to end: a scripted chat on the synthetic model (the
# program itself is built with the apps).
TESTS += tests/test-chat-script.sh
EXTRA_DIST += tests/test-chat-script.sh
