# FleetRL prepare image: the compose stack's and the Kubernetes manifests' one-shot jobs, not a service.
# `prepare` builds the demo's tiny model, task data and SFT warm-up onto the models volume (it runs the
# sort-digits recipe's warm-up through `fleetrl run`, which plans every service and starts the learner);
# `demo` follows the learner and measures held-out accuracy through the fleet. The service images carry
# none of this: each holds only shared/, its own service and the entrypoint (tests/deploy/test_images.py).
#   docker build -f deploy/docker/base.Dockerfile -t fleetrl-base .
#   docker build -f deploy/docker/prepare.Dockerfile -t fleetrl-prepare .
ARG BASE_IMAGE=fleetrl-base
FROM ${BASE_IMAGE}

COPY --chown=fleetrl:fleetrl shared /app/shared
COPY --chown=fleetrl:fleetrl services /app/services
COPY --chown=fleetrl:fleetrl deploy/__init__.py deploy/private_files.py /app/deploy/
COPY --chown=fleetrl:fleetrl deploy/local /app/deploy/local
COPY --chown=fleetrl:fleetrl deploy/run /app/deploy/run
COPY --chown=fleetrl:fleetrl deploy/compose/__init__.py deploy/compose/prepare.py deploy/compose/watch.py /app/deploy/compose/
COPY --chown=fleetrl:fleetrl deploy/docker/__init__.py deploy/docker/entrypoint.py /app/deploy/docker/
COPY --chown=fleetrl:fleetrl examples/sort-digits /app/examples/sort-digits
USER fleetrl
# The entrypoint waits for what $FLEETRL_WAIT_FOR lists (Redis, other services' /health, files), then execs.
ENTRYPOINT ["python", "-m", "deploy.docker.entrypoint"]
CMD ["python", "-m", "deploy.compose.prepare", "--out", "/models"]
