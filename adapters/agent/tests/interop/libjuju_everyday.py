"""python-libjuju 3.6.1.3's everyday work against lockstep, unchanged.

With an observer added before it connects: `Model().connect()` with no arguments (libjuju
finds the current controller and model in `$JUJU_DATA`, written by `lockstep bootstrap`,
as its users' scripts do), `get_status`, `add_machine` and `Machine.destroy` (each waits
for its delta), `get_config`/`set_config`, `deploy` of two local charm directories (the
upload, then `Application.Deploy`), `integrate` by application names, application config
get/set, `expose`, `add_unit`, `Unit.destroy`, `Application.destroy`, a charm-store deploy
(refused with libjuju's own error), `Controller().connect()` and `list_models`. Prints one
JSON line with what it saw.
"""
import asyncio
import json
import tempfile
import textwrap
from pathlib import Path

from juju.controller import Controller
from juju.errors import JujuError, JujuAPIError
from juju.model import Model


def charm_dir(root, name, metadata, config=""):
    path = Path(root) / name
    path.mkdir()
    (path / "metadata.yaml").write_text(textwrap.dedent(metadata))
    if config:
        (path / "config.yaml").write_text(textwrap.dedent(config))
    return str(path)


async def main():
    seen = []

    async def observe(delta, old, new, model):
        seen.append([delta.entity, delta.type, str(delta.get_id())])

    model = Model()
    model.add_observer(observe)
    await model.connect()
    result = {"model_name": model.info.name, "model_uuid": model.info.uuid}

    status = await model.get_status()
    result["status_model"] = status.model.name
    result["status_machines"] = sorted(status.machines.keys())

    machine = await model.add_machine()
    result["added_machine"] = machine.id
    result["machine_agent_status"] = machine.agent_status
    await machine.destroy()
    result["machines_after_destroy"] = sorted(model.machines.keys())

    result["config_before"] = (await model.get_config())["agent-version"].value
    await model.set_config({"logging-config": "<root>=DEBUG"})
    config = await model.get_config()
    result["logging_config"] = config["logging-config"].value
    result["logging_config_source"] = config["logging-config"].source

    with tempfile.TemporaryDirectory() as root:
        web = charm_dir(
            root,
            "web",
            """\
            name: web
            summary: a web server
            series: [jammy]
            requires:
              db:
                interface: pgsql
            """,
            """\
            options:
              port:
                type: int
                default: 80
                description: listen port
            """,
        )
        db = charm_dir(
            root,
            "db",
            """\
            name: db
            summary: a database
            series: [jammy]
            provides:
              db:
                interface: pgsql
            """,
        )
        web_app = await model.deploy(web)
        db_app = await model.deploy(db)
    result["deployed"] = sorted(model.applications.keys())
    result["web_charm_url"] = web_app.charm_url
    result["web_units"] = sorted(unit.name for unit in web_app.units)

    relation = await model.integrate("web", "db")
    result["relation_key"] = relation.key
    result["relation_id"] = relation.id
    result["relation_endpoints"] = sorted(
        "%s:%s:%s:%s"
        % (e.application_name, e.name, e.role, e.interface)
        for e in relation.endpoints
    )

    app_config = await web_app.get_config()
    result["port_default"] = app_config["port"]["value"]
    await web_app.set_config({"port": "8080"})
    result["port_set"] = (await web_app.get_config())["port"]["value"]
    await web_app.expose()

    units = await web_app.add_unit(count=1)
    result["added_units"] = [unit.name for unit in units]
    await units[0].destroy()
    await db_app.destroy()
    # Application.destroy returns once the call is answered; the removal's delta follows.
    await model.block_until(lambda: "db" not in model.applications, timeout=60)

    status = await model.get_status()
    unit = status.applications["web"].units["web/0"]
    result["unit_workload"] = [unit.workload_status.status, unit.workload_status.info]
    result["unit_agent"] = [unit.agent_status.status, unit.agent_status.info]
    result["web_exposed"] = status.applications["web"].exposed
    result["status_applications"] = sorted(status.applications.keys())

    try:
        await model.deploy("ubuntu")
        result["store_deploy"] = "deployed"
    except (JujuError, JujuAPIError) as error:
        result["store_deploy"] = str(error)

    await asyncio.sleep(0.5)
    await model.disconnect()
    result["deltas"] = seen

    controller = Controller()
    await controller.connect()
    result["models"] = await controller.list_models()
    result["controller_endpoints"] = [
        address for address, _ in controller._connector._connection.endpoints
    ]
    await controller.disconnect()
    print(json.dumps(result))


asyncio.run(main())
