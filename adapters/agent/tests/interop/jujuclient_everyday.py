"""python-jujuclient 0.54.0's deployer work against lockstep, unchanged.

RedirectInfo, login, a local charm uploaded with its `add_local_charm_dir` (which verifies
the server with Python's default trust store: the test points SSL_CERT_FILE at the
controller's CA), then `deploy`, `add_units`, `add_relation`, `status`, `get_config` and
`env.service.set` (0.54.0's `set_config` is broken). Prints one JSON line.
"""
import json
import sys
import tempfile
import textwrap
from pathlib import Path

from jujuclient.juju2.environment import Environment

port, ca_path, uuid, password = sys.argv[1:5]
env = Environment(
    "wss://127.0.0.1:%s/model/%s/api" % (port, uuid), ca_cert=ca_path, env_uuid=uuid
)
result = {"redirect": env.redirect_info()}
env.login(password, user="user-admin")

with tempfile.TemporaryDirectory() as root:
    for name, relation in [("web", "requires"), ("db", "provides")]:
        path = Path(root) / name
        path.mkdir()
        (path / "metadata.yaml").write_text(
            textwrap.dedent(
                """\
                name: %s
                summary: a test charm
                series: [jammy]
                %s:
                  db:
                    interface: pgsql
                """
                % (name, relation)
            )
        )
        if name == "web":
            (path / "config.yaml").write_text(
                "options:\n  port:\n    type: int\n    default: 80\n    description: port\n"
            )
        result["upload_" + name] = env.add_local_charm_dir(str(path), "jammy")["charm-url"]

env.deploy("web", result["upload_web"], num_units=1, config={"port": 81})
env.deploy("db", result["upload_db"], num_units=1)
result["added_units"] = env.add_units("web", 2)["units"]
result["relation"] = env.add_relation("web:db", "db:db")["endpoints"]
status = env.status()
result["status_model"] = status["model"]["name"]
result["status_applications"] = sorted(status["applications"])
result["web_units"] = sorted(status["applications"]["web"]["units"])
result["status_relations"] = [relation["key"] for relation in status["relations"]]
result["port"] = env.get_config("web")["port"]["value"]
env.service.set("web", {"port": 8080})
result["port_set"] = env.get_config("web")["port"]["value"]
print(json.dumps(result))
