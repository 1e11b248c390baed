"""``fleetrl run --on ray SPEC``: the run spec on a Ray cluster through deploy/ray/launcher.py. The launcher's
settings are rendered from the spec (``render.py``: the same per-service settings ``fleetrl run`` derives) into
``run_dir/ray/fleet.yaml``, then the launcher places the reward, rollout and learner actors and waits for the
learner. Without ``--ray-address`` it starts a local Ray (with CPUs enough for the run's actors) and, with no
``redis.url`` / ``$REDIS_URL``, an embedded Redis under run_dir; a cluster needs a Redis every node reaches.

Secrets stay out of the file: the control token (``$FLEETRL_TOKEN``, generated for this launch when unset), the run
key (``$FLEETRL_RUN_KEY``, else run_dir/run_key as ``fleetrl run`` keeps it) and a Redis URL with a password reach
the launcher through its environment only.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sys
from pathlib import Path

from deploy.private_files import write_private

from .plan import RUN_KEY_FILE, run_dir_of
from .render import RenderError, carry, write_ray
from .run_record import RunLock, RunLocked
from .spec import RunSpec


def _run_key(run_dir: Path) -> str:
    path = run_dir / RUN_KEY_FILE
    key = path.read_text().strip() if path.is_file() else ""
    if len(key) < 16:
        key = secrets.token_hex(32)
        write_private(path, key + "\n")
    return key


def run_on_ray(spec: RunSpec, spec_file: Path, *, address: str | None = None, say=print) -> int:
    """Render the spec for Ray, start it, wait for the learner; the learner's exit code (1: could not start)."""
    try:
        import ray
    except ImportError:
        say("error: fleetrl run --on ray needs ray: pip install -e '.[ray]'", file=sys.stderr)
        return 2
    try:
        carried = carry(spec, spec_file, target="ray")
    except (RenderError, ValueError) as exc:
        say(f"error: {spec_file}: {exc}", file=sys.stderr)
        return 2
    run_dir = run_dir_of(spec)
    lock = RunLock(run_dir)
    try:
        lock.acquire(f"fleetrl run --on ray {spec_file.name}")
    except RunLocked as exc:
        say(f"error: {exc}", file=sys.stderr)
        return 2
    server = None
    try:
        url = spec.redis.url or os.environ.get("REDIS_URL")
        if not url:
            if address:
                say("error: redis.url: a Ray cluster needs a Redis every node reaches; set redis.url in the spec or "
                    "$REDIS_URL", file=sys.stderr)
                return 2
            from shared.redis_server import EmbeddedRedis

            server = EmbeddedRedis(data_dir=run_dir / "redis").start()
            url = server.url
            say(f"[fleetrl] Redis at {server.display_url} (embedded, {run_dir / 'redis'})")
        os.environ["REDIS_URL"] = url  # the launcher reads ${REDIS_URL}; the file never holds a password
        os.environ.setdefault("FLEETRL_TOKEN", secrets.token_hex(16))
        os.environ.setdefault("FLEETRL_RUN_KEY", _run_key(run_dir))
        (path,) = write_ray(carried, run_dir / "ray", redis_url=url, ray_address=address)
        for note in carried.notes:
            say(f"[fleetrl] note: {note}")
        say(f"[fleetrl] run {spec.run_name} on Ray ({address or 'a local Ray'}); launcher settings in {path}")
        return _launch(ray, path, address, say)
    finally:
        if server is not None:
            server.stop()
        lock.release()


def _launch(ray, path: Path, address: str | None, say) -> int:
    from deploy.ray.launcher import REPO, FleetLauncher, LaunchError
    from deploy.ray.settings import LaunchSettings

    settings = LaunchSettings.from_file(path)
    init: dict = {"address": address, "namespace": settings.namespace}
    if not address:  # a local Ray: this checkout on the workers' path, CPUs enough for every actor of the run
        groups = (settings.reward, settings.rollout, settings.learner)
        need = sum(g.replicas * g.num_cpus for g in groups)
        init.update(num_cpus=max(os.cpu_count() or 1, math.ceil(need)), include_dashboard=False,
                    runtime_env={"env_vars": {"PYTHONPATH": str(settings.workdir or REPO)}})
    ray.init(**init)
    launcher = None
    try:
        launcher = FleetLauncher(settings)
        urls = launcher.start()
        say(f"[fleetrl] services up: {json.dumps(urls)}")
        code = launcher.wait()
        say(f"[fleetrl] learner finished with exit code {code}")
        return code
    except LaunchError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say("[fleetrl] interrupted: stopping the actors (the learner checkpoints)")
        return 130
    finally:
        if launcher is not None:
            launcher.stop()
        ray.shutdown()
