"""python-libjuju 3.6.1.3 adds machines to a controller bootstrapped with
`--provisioner local`: `Model().connect()` with no arguments (the client store lockstep
bootstrap wrote), then `Model.add_machine()` (MachineManager.AddMachines; libjuju waits for
the machine's delta) as many times as argv[1] says. Prints one JSON line: the machine ids.
"""
import asyncio
import json
import sys

from juju.model import Model


async def main(count):
    model = Model()
    await model.connect()
    added = []
    for _ in range(count):
        machine = await model.add_machine()
        added.append(machine.id)
    await model.disconnect()
    print(json.dumps({"added": added}))


asyncio.run(main(int(sys.argv[1])))
