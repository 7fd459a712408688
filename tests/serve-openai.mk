# pensieve-serve end to end through the official openai Python client (the
# server is built with the apps; the client runs from PV_OPENAI_VENV or the
# system python, and the test skips without either).
TESTS += tests/test-serve-openai.sh
EXTRA_DIST += tests/test-serve-openai.sh tests/serve-openai-client.py tests/tap_client.py
