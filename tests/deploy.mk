# deploy/ (issue 14): pensieve-serve replicas behind nginx, routed by
# session; the test runs them on the loopback with the synthetic model and
# skips without nginx or python3. scripts/bench-replicas measures them.
TESTS += tests/test-deploy.sh
EXTRA_DIST += tests/test-deploy.sh tests/deploy-client.py deploy/README.md deploy/run-replicas \
    deploy/nginx.conf.in deploy/balance-hash.conf deploy/balance-round-robin.conf scripts/bench-replicas
