"""A remote agent written against the raw worker protocol, with the standard library
only (no Django, no database): what an agent in another language does. The process
tests run it as a subprocess and kill or freeze it.

    python tests/support/remote_agent.py URL TOKEN AGENT WORKER LEASE_SECONDS

Each task's payload says how long to work (``work_seconds``). While it works, a
thread heartbeats every third of the lease. It prints one JSON line per event
(``claimed``, ``completed``, ``refused``) so the test can follow it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request


def call(url: str, token: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=90) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(api: str, token: str, agent: str, worker: str, lease_seconds: float) -> None:
    while True:
        status, answer = call(
            f"{api}/api/v1/agents/{agent}/claim",
            token,
            {"worker": worker, "limit": 1, "lease_seconds": lease_seconds, "wait_seconds": 5},
        )
        if status != 200:
            say("claim_failed", status=status, answer=answer)
            time.sleep(0.5)
            continue
        for task in answer["tasks"]:
            run(api, token, task, lease_seconds)


def run(api: str, token: str, task: dict, lease_seconds: float) -> None:
    say("claimed", task_id=task["id"], attempt=task["attempt"])
    lease = {"lease_token": task["lease_token"]}
    done = threading.Event()

    def beat() -> None:
        while not done.wait(lease_seconds / 3):
            call(f"{api}/api/v1/tasks/{task['id']}/heartbeat", token, lease)

    threading.Thread(target=beat, daemon=True).start()
    time.sleep(task["payload"].get("work_seconds", 0))
    done.set()
    status, answer = call(
        f"{api}/api/v1/tasks/{task['id']}/complete",
        token,
        {**lease, "result": {"by": sys.argv[4], "attempt": task["attempt"]}},
    )
    if status == 200:
        say("completed", task_id=task["id"])
    else:
        say("refused", task_id=task["id"], status=status, code=answer.get("code"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
