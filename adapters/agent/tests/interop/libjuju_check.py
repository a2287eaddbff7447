"""python-libjuju 3.6.1.3 against lockstep, unchanged.

Connects (login, facade negotiation, its pinger), reads FullStatus into libjuju's typed
objects while the agent is limited, and asks for the model config, which must fail with
error code `upgrade in progress` (libjuju does not retry). Prints one JSON line.
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
    try:
        await client.ModelConfigFacade.from_connection(connection).ModelGet()
        code = None
    except JujuAPIError as error:
        code = error.error_code
    await connection.close()
    print(json.dumps({"status_model": status.model.name, "error_code": code}))


asyncio.run(main())
