"""python-libjuju 3.6.1.3 against lockstep, unchanged.

Connects (login, facade negotiation, its pinger), reads FullStatus into libjuju's typed
objects and the model config while the agent is limited (reads are served in every phase),
and sets a model config key, which must fail with error code `upgrade in progress` (libjuju
does not retry). Prints one JSON line.
"""
import asyncio
import json
import sys

from juju.client import client
from juju.client.connection import Connection
from juju.errors import JujuAPIError


async def main():
    port, ca_path, uuid, password = sys.argv[1:5]
    with open(ca_path) as ca:
        cacert = ca.read()
    connection = await Connection.connect(
        endpoint="127.0.0.1:%s" % port,
        uuid=uuid,
        username="admin",
        password=password,
        cacert=cacert,
    )
    status = await client.ClientFacade.from_connection(connection).FullStatus(patterns=[])
    model_config = client.ModelConfigFacade.from_connection(connection)
    config = await model_config.ModelGet()
    try:
        await model_config.ModelSet(config={"logging-config": "<root>=DEBUG"})
        code = None
    except JujuAPIError as error:
        code = error.error_code
    await connection.close()
    agent_version = config.config["agent-version"].value
    print(
        json.dumps(
            {
                "status_model": status.model.name,
                "agent_version": agent_version,
                "error_code": code,
            }
        )
    )


asyncio.run(main())
