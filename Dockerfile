# Dockerfile: ferry on Debian 12, built by the project's own scripts (the ones the test suite
# runs): scripts/setup installs the Debian packages, scripts/build configures and builds into
# build/; the container runs the demo (a verified RL weight-sync loop) by default.
# docs/guides/container.md says how to build and run it; tests/examples/test_dockerfile.py
# checks these steps against the scripts.
FROM debian:12

WORKDIR /ferry
# The package step first, so that a source change does not reinstall the packages.
COPY scripts/setup scripts/setup
RUN scripts/setup
COPY . .
RUN scripts/build
CMD ["build/host/cli/ferry", "demo"]
