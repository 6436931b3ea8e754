# syntax=docker/dockerfile:1
# The slotune operator image; trial load Jobs run it too (`slotune trial-load`).
#
#   docker build -t slotune/operator:0.1.0 .
#
# Here, with no Docker daemon and no registry: `make image` (scripts/build-image.sh) builds it
# with buildah on a Debian base bootstrapped by mmdebstrap and passed as BASE.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# A virtual environment holding slotune and its dependencies, nothing else.
RUN python3 -m venv /opt/slotune
# Dependencies (and the build backend) first, from pyproject.toml alone, so a code change
# reuses this layer. A machine
# behind a TLS-intercepting proxy passes its CA bundle as the build secret `cacert`; it is used
# by this step only and never stored in a layer.
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=secret,id=cacert \
    if [ -s /run/secrets/cacert ]; then export PIP_CERT=/run/secrets/cacert; fi; \
    /opt/slotune/bin/python -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' > /tmp/requirements.txt \
    && /opt/slotune/bin/pip install --no-cache-dir --disable-pip-version-check -q -r /tmp/requirements.txt
COPY README.md /src/README.md
COPY operator /src/operator
# The package itself needs no network: its build backend came with the dependencies.
RUN /opt/slotune/bin/pip install --no-cache-dir --disable-pip-version-check -q --no-deps \
        --no-build-isolation /src \
    && /opt/slotune/bin/pip uninstall -y -q setuptools pip \
    && rm -rf /opt/slotune/bin/activate* \
    # Bytecode now: the root filesystem is read-only at run time.
    && /opt/slotune/bin/python -m compileall -q -j 0 /opt/slotune/lib

FROM ${BASE}
LABEL org.opencontainers.image.title="slotune operator" \
      org.opencontainers.image.licenses="Apache-2.0"
# No pip in the final image: the base's own goes too (where it has one).
RUN python3 -m pip uninstall -y -q pip 2>/dev/null || true
# jemalloc serves every allocation, Python's small objects too (PYTHONMALLOC=malloc), and hands
# freed memory back: with Python's and glibc's allocators, an operator whose 500 objects were
# deleted kept 1.6-1.75x its idle memory, and more after each burst (bench/results/scale.md,
# "Churn"). Its thread caches hold at most 20 freed objects of a size (not 200): the operator's
# 35 threads each kept theirs full, 10-16 MiB in all after a burst; bounded, they cost no CPU
# measurable in a storm (scale.md, "Where the rest was"; `tcache:false` in the chart's extraEnv
# gives back more, for 1.17x the CPU). The mmdebstrap base has it; a stock Python base gets it
# here.
RUN if ! ls /usr/lib/*-linux-gnu/libjemalloc.so.2 >/dev/null 2>&1; then \
        apt-get update -q && apt-get install -y -q --no-install-recommends libjemalloc2 \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && ln -s /usr/lib/*-linux-gnu/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2
COPY --from=build /opt/slotune /opt/slotune
# A read-only root: everything that writes goes to /tmp (an emptyDir in the chart).
ENV PATH=/opt/slotune/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LD_PRELOAD=/usr/local/lib/libjemalloc.so.2 \
    PYTHONMALLOC=malloc \
    MALLOC_CONF=background_thread:true,narenas:2,tcache_nslots_small_max:20
# Numeric, so that `runAsNonRoot` without `runAsUser` (the trial Job) can verify it.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["slotune"]
CMD ["operator"]
