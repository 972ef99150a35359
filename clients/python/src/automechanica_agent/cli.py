"""``automechanica-agent --api URL --token T --agent NAME --handler module:function``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from .runner import Handler, Runner


def load_handler(spec: str) -> Handler:
    """``module:function``, imported (the current directory is on the path)."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"--handler must be module:function, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    handler = getattr(importlib.import_module(module_name), name, None)
    if not callable(handler):
        raise ValueError(f"{spec}: {name!r} is not a function of {module_name}")
    return handler


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="automechanica-agent", description=__doc__)
    p.add_argument("--api", required=True, help="the server's URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--token", default=os.environ.get("AUTOMECHANICA_TOKEN"),
                   help="a write token (default: $AUTOMECHANICA_TOKEN)")  # fmt: skip
    p.add_argument("--agent", required=True, help="the agent whose tasks to run")
    p.add_argument("--handler", required=True, help="module:function run on each task")
    p.add_argument("--concurrency", type=int, default=4, help="tasks at once (4)")
    p.add_argument("--worker", help="this worker's name (default: host:pid)")
    p.add_argument("--lease-seconds", type=float, default=30.0, help="(30)")
    p.add_argument("--wait-seconds", type=float, default=10.0,
                   help="long poll (10); a stop waits for one in flight")  # fmt: skip
    p.add_argument("--grace-seconds", type=float, default=10.0,
                   help="on SIGTERM, how long running tasks may finish (10)")  # fmt: skip
    p.add_argument("--dispatch", metavar="NATS_URL",
                   help="follow relay_events --dispatch's commands on NATS instead of "
                   "long-polling (needs the nats extra)")  # fmt: skip
    p.add_argument("--namespace", default="", help="as relay_events --namespace")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    if not args.token:
        print("automechanica-agent: give --token or set AUTOMECHANICA_TOKEN", file=sys.stderr)
        return 2
    if not 1 <= args.concurrency <= 500:
        print("automechanica-agent: --concurrency must be 1 to 500", file=sys.stderr)
        return 2
    try:
        handler = load_handler(args.handler)
    except (ValueError, ImportError) as error:
        print(f"automechanica-agent: {error}", file=sys.stderr)
        return 2
    dispatch = None
    if args.dispatch:
        try:
            from .dispatch import NatsCommands
        except ImportError:
            print("automechanica-agent: --dispatch needs the nats extra "
                  "(pip install './clients/python[nats]')", file=sys.stderr)  # fmt: skip
            return 2
        dispatch = NatsCommands(args.dispatch, args.agent, args.namespace)
    runner = Runner(
        args.api,
        args.token,
        args.agent,
        handler,
        worker=args.worker,
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        wait_seconds=args.wait_seconds,
        grace_seconds=args.grace_seconds,
        dispatch=dispatch,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: runner.stop())
    counts = runner.run()
    logging.getLogger(__name__).info("stopped: %s", counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
