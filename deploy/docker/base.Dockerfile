# FleetRL base image: Python, the CPU (or given) torch and every runtime dependency, no project code.
# The per-service images (rollout / reward / learner .Dockerfile) add the code on top, so a code change
# rebuilds only a thin layer.
#
#   docker build -f deploy/docker/base.Dockerfile -t fleetrl-base .                         # python:3.11-slim
#   podman build -f deploy/docker/base.Dockerfile --build-arg BASE_IMAGE=localhost/localdebian -t fleetrl-base .
#
# torch: a wheel staged in deploy/docker/stage/ (make compose-test does) wins; otherwise it comes from
# TORCH_INDEX_URL (PyTorch's CPU index by default: PyPI's torch is the multi-GB CUDA build).
# A CA bundle staged as deploy/docker/stage/ca-bundle.crt is used by pip (networks behind a TLS proxy).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG PIP_EXTRA_ARGS=""
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app

# A venv keeps pip away from the distribution's Python (Debian marks it externally managed).
RUN python3 -m venv /opt/venv && groupadd --system --gid 10001 fleetrl \
 && useradd --system --uid 10001 --gid fleetrl --home-dir /app --shell /usr/sbin/nologin fleetrl \
 && mkdir -p /app /models /checkpoints /config && chown fleetrl:fleetrl /app /models /checkpoints

# The staged files are bind-mounted, never copied: the wheel leaves no layer behind.
RUN --mount=type=bind,source=deploy/docker/stage,target=/stage \
    set -eu; \
    if [ -f /stage/ca-bundle.crt ]; then export PIP_CERT=/stage/ca-bundle.crt; fi; \
    if ls /stage/torch-*.whl >/dev/null 2>&1; then \
      pip install ${PIP_EXTRA_ARGS} --find-links /stage "torch==${TORCH_VERSION}"; \
    else \
      pip install ${PIP_EXTRA_ARGS} --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple \
        "torch==${TORCH_VERSION}"; \
    fi

# Dependencies from pyproject.toml only (this layer is rebuilt when they change, not when code does).
COPY pyproject.toml /tmp/pyproject.toml
RUN --mount=type=bind,source=deploy/docker/stage,target=/stage \
    python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; \
print("\n".join([d for d in p["dependencies"] if not d.startswith("torch")] + p["optional-dependencies"]["learner"]))' \
      > /tmp/requirements.txt \
 && if [ -f /stage/ca-bundle.crt ]; then export PIP_CERT=/stage/ca-bundle.crt; fi \
 && pip install ${PIP_EXTRA_ARGS} -r /tmp/requirements.txt "torch==${TORCH_VERSION}" \
 && rm /tmp/requirements.txt

WORKDIR /app
