# FleetRL learner on the deepspeed image (GPU; built and run only where NVIDIA GPUs and the public images are).
# The base image brings CUDA and its own torch: FleetRL's pure-Python dependencies go on top, torch is
# left exactly as the base pinned it (that version coupling is why each engine has its own image).
#   docker build -f deploy/docker/learner-deepspeed.Dockerfile -t fleetrl-learner-deepspeed .
# compose builds it FROM the vLLM image instead (BASE_IMAGE): a learner that updates vLLM servers opens
# vLLM's own NCCL group for it, so the same vLLM must be importable here.
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false PYTHONPATH=/app
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; \
keep = [d for d in p["dependencies"] if not d.startswith(("torch", "transformers", "tokenizers"))]; \
print("\n".join(keep + p["optional-dependencies"]["learner"] + p["optional-dependencies"]["tinker"] \
+ p["optional-dependencies"]["deepspeed"]))' > /tmp/requirements.txt
RUN python3 -c "import torch; print('torch', torch.__version__)" \
 && python3 -m pip install -r /tmp/requirements.txt "torch==$(python3 -c 'import torch; print(torch.__version__)')" \
 && python3 -m pip install "transformers>=4.45" "tokenizers>=0.20" --upgrade-strategy only-if-needed \
 && rm /tmp/requirements.txt \
 && (getent group fleetrl || groupadd --system --gid 10001 fleetrl) \
 && (id fleetrl || useradd --system --uid 10001 --gid fleetrl --home-dir /app --shell /usr/sbin/nologin fleetrl) \
 && mkdir -p /app /models /user-model /checkpoints /config /hf-cache \
 && chown fleetrl:fleetrl /app /models /checkpoints /hf-cache

WORKDIR /app
COPY --chown=fleetrl:fleetrl shared /app/shared
COPY --chown=fleetrl:fleetrl services/__init__.py /app/services/
COPY --chown=fleetrl:fleetrl services/learner /app/services/learner
COPY --chown=fleetrl:fleetrl deploy/__init__.py /app/deploy/
COPY --chown=fleetrl:fleetrl deploy/docker/__init__.py deploy/docker/entrypoint.py /app/deploy/docker/
USER fleetrl
EXPOSE 8003
ENTRYPOINT ["python3", "-m", "deploy.docker.entrypoint"]
CMD ["python3", "-m", "services.learner", "--config", "/config/learner.yaml"]
