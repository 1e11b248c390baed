# FleetRL learner service: the shared base image plus the project code (a thin layer).
#   docker build -f deploy/docker/base.Dockerfile -t fleetrl-base .
#   docker build -f deploy/docker/learner.Dockerfile -t fleetrl-learner .
ARG BASE_IMAGE=fleetrl-base
FROM ${BASE_IMAGE}

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
