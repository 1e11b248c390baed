# FleetRL learner service: the shared base image plus the project code (a thin layer).
#   docker build -f deploy/docker/base.Dockerfile -t fleetrl-base .
#   docker build -f deploy/docker/learner.Dockerfile -t fleetrl-learner .
ARG BASE_IMAGE=fleetrl-base
FROM ${BASE_IMAGE}
ARG PIP_EXTRA_ARGS=""

# The Tinker mode (services/learner/tinker: the tinker client's own protobuf schema, zstd) is the `tinker` extra of
# pyproject.toml; installed here, not in the base the rollout and reward images share.
COPY pyproject.toml /tmp/pyproject.toml
RUN --mount=type=bind,source=deploy/docker/stage,target=/stage \
    python -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]\
["optional-dependencies"]["tinker"]))' > /tmp/requirements.txt \
 && if [ -f /stage/ca-bundle.crt ]; then export PIP_CERT=/stage/ca-bundle.crt; fi \
 && pip install ${PIP_EXTRA_ARGS} -r /tmp/requirements.txt "torch==$(python -c 'import torch; print(torch.__version__)')" \
 && rm /tmp/requirements.txt /tmp/pyproject.toml

COPY --chown=fleetrl:fleetrl shared /app/shared
COPY --chown=fleetrl:fleetrl services/__init__.py /app/services/
COPY --chown=fleetrl:fleetrl services/learner /app/services/learner
COPY --chown=fleetrl:fleetrl deploy/__init__.py /app/deploy/
COPY --chown=fleetrl:fleetrl deploy/docker/__init__.py deploy/docker/entrypoint.py /app/deploy/docker/
USER fleetrl
EXPOSE 8003
# The entrypoint waits for what $FLEETRL_WAIT_FOR lists (Redis, other services' /health, files), then execs.
ENTRYPOINT ["python", "-m", "deploy.docker.entrypoint"]
CMD ["python", "-m", "services.learner", "--config", "/config/learner.yaml"]
