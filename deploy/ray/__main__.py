"""``python -m deploy.ray --config deploy/ray/fleet.example.yaml [--address auto]``: run a FleetRL
deployment on a Ray cluster until the learner finishes (Ctrl-C stops it; the learner checkpoints)."""

from __future__ import annotations

import argparse
import json
import sys

from deploy.ray.settings import LaunchSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.ray", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="launcher YAML (replicas, resources, service settings)")
    ap.add_argument("--address", default=None, help="Ray address (default: the config's ray_address, else local)")
    args = ap.parse_args(argv)
    settings = LaunchSettings.from_file(args.config)

    import ray

    from deploy.ray.launcher import REPO, FleetLauncher, LaunchError

    address = args.address or settings.ray_address
    # Workers import the launcher's actor class: on a local Ray, point them at this checkout; on a cluster,
    # the nodes run the FleetRL image (or pass a runtime_env working_dir).
    runtime_env = None if address else {"env_vars": {"PYTHONPATH": str(settings.workdir or REPO)}}
    ray.init(address=address, namespace=settings.namespace, runtime_env=runtime_env)
    launcher = None
    try:
        launcher = FleetLauncher(settings)
        urls = launcher.start()
        print(json.dumps({"urls": urls}, indent=2), flush=True)
        code = launcher.wait()
        print(f"learner finished with exit code {code}", flush=True)
        return code
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if launcher is not None:
            launcher.stop()
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
