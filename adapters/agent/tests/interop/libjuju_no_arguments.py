"""python-libjuju 3.6.1.3 against a real lockstepd, found the way libjuju is usually used:
`Controller().connect()` and `Model().connect()` with no arguments read Juju's client store
(`$JUJU_DATA/controllers.yaml`, `models.yaml`, `accounts.yaml`, `cookies/NAME.json`) that
`lockstep bootstrap` wrote. Prints one JSON line.
"""
import asyncio
import json

from juju.controller import Controller
from juju.model import Model


async def main():
    controller = Controller()
    await controller.connect()
    controller_name = controller.controller_name
    controller_uuid = controller.controller_uuid
    models = await controller.list_models()
    await controller.disconnect()

    model = Model()
    await model.connect()
    model_name = model.name
    model_uuid = model.uuid
    status = await model.get_status()
    machines = sorted(status.machines.keys())
    await model.disconnect()
    print(
        json.dumps(
            {
                "controller": controller_name,
                "controller-uuid": controller_uuid,
                "models": models,
                "model": model_name,
                "model-uuid": model_uuid,
                "status-model": status.model.name,
                "machines": machines,
            }
        )
    )


asyncio.run(main())
