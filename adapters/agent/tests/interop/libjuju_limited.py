"""python-libjuju 3.6.1.3 against a lockstepd held in a limited phase, unchanged.

With an observer added before it connects: `Model.connect` (login, facade negotiation, its
pinger, the all-watcher, whose first batch `connect` waits for), `get_status()` into
libjuju's typed objects and `get_config()` (reads are served in every phase), then two
writes, `set_config` (`ModelConfig.ModelSet`) and `add_machine` (`MachineManager.AddMachines`),
each of which must fail with Juju's error code `upgrade in progress`: libjuju raises
`JujuAPIError` and does not retry. Prints one JSON line with what it saw.

Arguments: the API port, a file holding the controller's CA, the model's uuid, the admin
password (libjuju is given them explicitly).
"""
import asyncio
import json
import sys

from juju.errors import JujuAPIError
from juju.model import Model


async def write_refused(write):
    try:
        await write
    except JujuAPIError as error:
        info = error.error_info or {}
        return {"code": error.error_code, "message": error.message, "phase": info.get("phase")}
    return None


async def main():
    port, ca_path, uuid, password = sys.argv[1:5]
    with open(ca_path) as ca:
        cacert = ca.read()
    seen = []

    async def observe(delta, old, new, model):
        seen.append([delta.entity, delta.type, str(delta.get_id())])

    model = Model()
    model.add_observer(observe)
    await model.connect(
        endpoint="127.0.0.1:%s" % port,
        uuid=uuid,
        username="admin",
        password=password,
        cacert=cacert,
    )
    result = {"model_name": model.info.name, "model_uuid": model.info.uuid}
    status = await model.get_status()
    result["status_model"] = status.model.name
    result["status_machines"] = sorted(status.machines.keys())
    result["agent_version"] = (await model.get_config())["agent-version"].value
    # The watcher's first batch, as the observer was told of it (its callbacks run as
    # tasks, which the calls above let run).
    result["first_deltas"] = list(seen)
    result["set_config"] = await write_refused(
        model.set_config({"logging-config": "<root>=DEBUG"})
    )
    result["add_machine"] = await write_refused(model.add_machine())
    result["machines"] = sorted(model.machines.keys())
    await model.disconnect()
    print(json.dumps(result))


asyncio.run(main())
