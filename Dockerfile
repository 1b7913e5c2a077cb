# Tripwire container image (SPEC §7). Build: docker build -t tripwire .
# Run:   docker run --init -p 8713:8713 -p 8714:8714 -e TRIPWIRE_ADMIN_TOKEN=change-me -v tripwire-data:/data tripwire
# The admin listener is on 0.0.0.0 in the container, so Tripwire refuses to start without an admin token.
# Nothing is written outside /data (traces, persisted guard config) and /tmp: the image runs with a
# read-only root filesystem. docs/deployment.md has the container, sidecar and standalone recipes.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: install the package and its dependencies into a self-contained venv -------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/tripwire
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY viewer ./viewer
COPY addons ./addons
# optional extras in the image: otlp (trace export, --otlp-endpoint / the chart's otlp.endpoint);
# --build-arg TRIPWIRE_EXTRAS= builds without them
ARG TRIPWIRE_EXTRAS=otlp
RUN /opt/tripwire/bin/pip install --no-cache-dir ".${TRIPWIRE_EXTRAS:+[$TRIPWIRE_EXTRAS]}" \
    && /opt/tripwire/bin/python -m compileall -q /opt/tripwire

# ---- runtime: the venv, a fixed non-root user, /data as the only writable place -----------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tripwire" \
      org.opencontainers.image.description="Local proxy between AI agents and their LLM APIs and MCP servers: AgentDbg traces, loop detection, budgets, circuit breakers." \
      org.opencontainers.image.licenses="MIT"

# A fixed UID/GID so Kubernetes runAsNonRoot/runAsUser and volume ownership (fsGroup) can rely on it.
RUN groupadd --system --gid 10001 tripwire \
    && useradd --system --no-log-init --uid 10001 --gid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin tripwire \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && chmod 0750 /data

COPY --from=build /opt/tripwire /opt/tripwire

# Container defaults, all overridable (flags beat TRIPWIRE_* env, SPEC §5.4). The proxy listens on all
# interfaces here; the Helm chart's sidecar mode passes --listen 127.0.0.1:8713 instead.
# HOME=/tmp: the ~/.tripwire/config.yaml lookup finds nothing and nothing is written under a home dir.
ENV PATH=/opt/tripwire/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TRIPWIRE_DATA_DIR=/data \
    TRIPWIRE_LISTEN=0.0.0.0:8713 \
    TRIPWIRE_ADMIN_LISTEN=0.0.0.0:8714

WORKDIR /tmp
VOLUME ["/data"]
EXPOSE 8713 8714
USER 10001:10001

# /healthz answers 200 while the process runs (trace-store trouble is in its body, never a failure).
# The slim image has no curl: use Python's urllib on the admin port taken from TRIPWIRE_ADMIN_LISTEN.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; h, _, p = os.environ.get('TRIPWIRE_ADMIN_LISTEN', '127.0.0.1:8714').rpartition(':'); h = h.strip('[]'); h = '127.0.0.1' if h in ('', '0.0.0.0', '::') else h; urllib.request.urlopen('http://' + (f'[{h}]' if ':' in h else h) + ':' + p + '/healthz', timeout=4)"]

ENTRYPOINT ["tripwire"]
CMD ["serve"]
