# syntax=docker/dockerfile:1
#
# ironic-proxy container image.
#
#   docker build -t ironic-proxy:0.1.0 .
#
# Base images, pinned by tag:
#   rust:1.95.0-bookworm                      the toolchain this repository is tested with
#                                             (rustc 1.95.0; Cargo.toml's rust-version is the
#                                             minimum), on Debian 12
#   gcr.io/distroless/cc-debian12:nonroot     runtime: the binary links glibc (and libgcc_s)
#                                             dynamically, and this is the smallest maintained
#                                             image that has exactly those: no shell, no package
#                                             manager, a non-root user (65532). Same Debian 12
#                                             glibc (2.36) as the build stage.
# Bump both together with the toolchain; pin by digest (@sha256:...) in a release pipeline.
# debian:bookworm-slim would also work but adds ~50 MB of shell and tools nothing here uses;
# the Kubernetes probes use HTTP, never a shell.
#
# No CA roots are added: the proxy trusts only the operator's CA bundle from its config
# (identity.trust). (The distroless base happens to carry Debian's ca-certificates; the proxy
# never reads them.)
#
# Build context: .dockerignore is an allow-list of what the build reads (buildah honours it as
# Docker does; scripts/check-image assembles the same context without a container engine).
#
# Without a Docker engine: scripts/build-image builds this file with buildah (as root, runc),
# against local stand-ins for the two base images where no registry can be reached, and
# scripts/check-container runs the result as the kit runs its sidecar; scripts/test runs both.
#
# Build time: about three release builds (the load tools, the instrumented binary, the final one)
# and two training runs. Measured with scripts/build-image on a 2-core machine shared with other
# builds (load average 8 to 38): 66 min for the build stage; the two stand-ins and the apt-get
# step together under 4 min. The three builds are those scripts/check-image runs on the host.
#
# Size, measured (scripts/build-image on the stand-ins, 2026-12): 42.8 MB uncompressed, 15.9 MB
# as an OCI archive (gzip layers): the 23.8 MB base (the stand-in; the published distroless cc
# is about the same, ~23 MB) and the 19.0 MB binary (tokio, hyper, rustls with aws-lc-rs; about
# 7 MB of it the original text BOLT keeps and the process never touches). Run as the kit runs it
# (scripts/check-container): 0.41-0.45 s from `podman run` to /readyz 200, of which 0.07-0.15 s
# from the container's start to the proxy's "ready".

ARG VERSION=0.1.0

FROM rust:1.95.0-bookworm AS build
WORKDIR /src
# llvm-profdata of the LLVM rustc 1.95 is built on (22): merges the training run's profile for
# the profile-guided build; llvm-bolt and merge-fdata of the same LLVM (bolt-22) lay the linked
# binary out by a second training run. Debian 12 has both (bookworm-security); bump with the
# toolchain.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends llvm-22 bolt-22 \
    && rm -rf /var/lib/apt/lists/*
COPY . .
# aws-lc-sys builds its C code with the image's gcc; no cmake or Go is needed for it.
# scripts/build-pgo: an instrumented build, a training run of about 30 s on 127.0.0.1 inside
# the build container (scripts/pgo-train: the load generator and backend of benches/load), then
# the release build with that profile (10 % less CPU per keep-alive request than without it,
# docs/benchmarks-history-2026.md round 19), then BOLT's layout of that binary by a second training
# run (round 20). The cache mounts keep the registry and target/ between builds.
# BUILD_KIND=release: one plain release build instead (a release cut when the profile-guided
# build does not fit the time; CHANGELOG.md says which a release is). REVISION: the commit,
# which the context (no .git) cannot tell; both reach `ironic-proxy --version` through
# IRONIC_PROXY_COMMIT and IRONIC_PROXY_BUILD_KIND (src/cli/version.rs).
ARG REVISION=unknown
ARG BUILD_KIND=pgo
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    export IRONIC_PROXY_COMMIT="${REVISION}" IRONIC_PROXY_BUILD_KIND="${BUILD_KIND}" \
    && case "${BUILD_KIND}" in \
         pgo) scripts/build-pgo /out/ironic-proxy ;; \
         release) cargo build --release --locked -q --bin ironic-proxy \
                  && mkdir -p /out && cp target/release/ironic-proxy /out/ironic-proxy ;; \
         *) echo "BUILD_KIND must be pgo or release" >&2; exit 1 ;; \
       esac

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION
ARG REVISION=unknown
# The repository URL (Cargo.toml's `repository`, passed by scripts/build-image).
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="ironic-proxy" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.description="TLS/mTLS sidecar, self-issued identity and DNS load balancer for OpenStack Ironic" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=build /out/ironic-proxy /usr/local/bin/ironic-proxy
# Numeric, so that kubelet can verify runAsNonRoot without a runAsUser in the pod spec.
USER 65532:65532
# API (6385), JSON-RPC (6189), admin (9901); the listeners are whatever the config says.
EXPOSE 6385 6189 9901
ENTRYPOINT ["/usr/local/bin/ironic-proxy"]
# A role from environment variables (IRONIC_PROXY_PROFILE=sidecar, ...) or a mounted file
# (IRONIC_PROXY_CONFIG=/etc/ironic-proxy/config.toml); `run` alone would serve the dev config.
CMD ["run"]
