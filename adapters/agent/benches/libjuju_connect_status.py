"""python-libjuju 3.6.1.3's `Model().connect()` then `get_status()`, timed, unchanged.

Runs `rounds` times in one process against one running controller, each round a new
`Model`, connected as a script does it. With `--store`, `Model().connect()` takes no
arguments and finds the controller in Juju's client store ($JUJU_DATA, written by
`lockstep bootstrap`); otherwise it is given the endpoint, the model uuid, the admin's
password and the CA. Prints one JSON line: every round's seconds for connect, for
get_status, and for both.
"""
import asyncio
import json
import sys
import time

from juju.model import Model


async def main():
    rounds = int(sys.argv[1])
    if sys.argv[2] == "--store":
        arguments = {}
    else:
        port, ca_path, uuid, password = sys.argv[2:6]
        with open(ca_path) as ca:
            arguments = dict(
                endpoint="127.0.0.1:%s" % port,
                uuid=uuid,
                username="admin",
                password=password,
                cacert=ca.read(),
            )
    connects, statuses, totals = [], [], []
    for _ in range(rounds):
        model = Model()
        started = time.perf_counter()
        await model.connect(**arguments)
        connected = time.perf_counter()
        status = await model.get_status()
        done = time.perf_counter()
        assert status.model.name, status
        await model.disconnect()
        connects.append(connected - started)
        statuses.append(done - connected)
        totals.append(done - started)
    print(json.dumps({"connect": connects, "status": statuses, "total": totals}))


asyncio.run(main())
