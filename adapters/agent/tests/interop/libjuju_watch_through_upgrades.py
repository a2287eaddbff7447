"""python-libjuju 3.6.1.3's model watcher kept running while the controller upgrades itself.

`Model()` connects with no arguments, through Juju's client store ($JUJU_DATA), and stays
connected: libjuju's own watcher task (`Model._watch`: `Client.WatchAll`, then
`AllWatcher.Next` in a loop) applies each delta to `model.machines` and tells an observer.
libjuju is unchanged; it is only watched from outside, by wrapping two methods of its
`Connection` class (each wrapper calls the original):

- `rpc`: counts every request by connection, facade and method, and keeps each
  `AllWatcher.Next` reply's deltas with the revisions lockstep adds to them (`revisions`,
  an extension libjuju ignores);
- `reconnect`: counts libjuju's reconnections (it reconnects when its websocket closes, and
  its watcher then starts over from a new `WatchAll`, whose first batch is the whole model).

Prints `{"watching": ...}` once `connect` has returned (it waits for the watcher's first
batch). Then waits for the file named by $LOCKSTEP_EXPECTED_MACHINES, a JSON list of
machine ids, and until the observer has been told of each (at most 90 s), and prints one
JSON line with what it saw before it disconnects. The command-line arguments (API port, CA
file, model uuid, password) are not used.
"""
import asyncio
import json
import os
import time

from juju.client.connection import Connection
from juju.model import Model

BOUND_SECONDS = 90

requests = []  # [id(connection), facade, method], in the order sent
# each AllWatcher.Next reply: [[revision, entity, type, id, agent-version], ...], the
# agent-version of a model delta only
next_batches = []
reconnects = []  # id(connection) of each reconnect


def delta_id(entity, data):
    if entity == "model":
        return data.get("model-uuid")
    if entity == "relation":
        return data.get("key")
    if entity == "machine":
        return data.get("id")
    return data.get("name", data.get("id", data.get("key")))


original_rpc = Connection.rpc


async def recording_rpc(self, msg, encoder=None):
    requests.append([id(self), msg.get("type"), msg.get("request")])
    result = await original_rpc(self, msg, encoder)
    if msg.get("type") == "AllWatcher" and msg.get("request") == "Next":
        response = result.get("response") or {}
        deltas = response.get("deltas") or []
        revisions = response.get("revisions") or [None] * len(deltas)
        next_batches.append(
            [
                [
                    revision,
                    entity,
                    change,
                    delta_id(entity, data),
                    data.get("agent-version") if entity == "model" else None,
                ]
                for revision, (entity, change, data) in zip(revisions, deltas)
            ]
        )
    return result


original_reconnect = Connection.reconnect


async def recording_reconnect(self):
    reconnects.append(id(self))
    return await original_reconnect(self)


Connection.rpc = recording_rpc
Connection.reconnect = recording_reconnect


def counts(connection):
    counted = {}
    for owner, facade, method in requests:
        if owner == id(connection):
            key = "%s.%s" % (facade, method)
            counted[key] = counted.get(key, 0) + 1
    return counted


async def main():
    observed = []  # [entity, type, id] as libjuju's observer was told, in order

    async def observe(delta, old, new, model):
        observed.append([delta.entity, delta.type, str(delta.get_id())])

    model = Model()
    model.add_observer(observe)
    await model.connect()
    connection = model.connection()
    websocket = connection._ws
    print(json.dumps({"watching": sorted(model.machines.keys())}), flush=True)

    expected_file = os.environ["LOCKSTEP_EXPECTED_MACHINES"]
    deadline = time.monotonic() + BOUND_SECONDS
    expected = None
    while time.monotonic() < deadline:
        if expected is None and os.path.exists(expected_file):
            with open(expected_file) as file:
                expected = json.load(file)
        if expected is not None:
            added = {
                id_ for entity, change, id_ in observed if entity == "machine" and change == "add"
            }
            if added >= set(expected):
                break
        await asyncio.sleep(0.05)

    result = {
        "observed": observed,
        "next_batches": next_batches,
        "reconnects": len(reconnects),
        "same_websocket": connection._ws is websocket,
        "same_connection": model.connection() is connection,
        "monitor_status": connection.monitor.status,
        "watcher_running": not model._watcher_task.done(),
        "requests": counts(connection),
        "machines": sorted(model.machines.keys()),
    }
    await model.disconnect()
    print(json.dumps(result), flush=True)


asyncio.run(main())
