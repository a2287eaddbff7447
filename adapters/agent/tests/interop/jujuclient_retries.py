"""python-jujuclient 0.54.0 against a lockstepd held in a limited phase, unchanged.

Asks RedirectInfo (which must say "not redirected"), logs in, reads status and the model
config (reads are served in every phase), then adds a machine (`Client.AddMachines`, a
write that is not idempotent), which lockstep refuses with `upgrade in progress` until the
controller is Ready: jujuclient resends it about once a second
(`BaseRPC._rpc_retry_if_upgrading`) until it is answered. Then, Ready, it sets a model
config key and reads status again. Prints one JSON line with what it saw; `AddMachines`
sends are counted by wrapping the connection's `_send_request`.

Arguments: the API port, a file holding the controller's CA, the model's uuid, the admin
password.
"""
import json
import sys

from jujuclient.juju2.environment import Environment

port, ca_path, uuid, password = sys.argv[1:5]
env = Environment(
    "wss://127.0.0.1:%s/model/%s/api" % (port, uuid), ca_cert=ca_path, env_uuid=uuid
)
redirect = env.redirect_info()
env.login(password, user="user-admin")
limited_status = env.status()
limited_config = env.get_env_config()

sent = []
original = env._send_request


def counting(op):
    sent.append(op.get("request"))
    return original(op)


env._send_request = counting
added = env.add_machine()
env._send_request = original
env.set_env_config({"logging-config": "<root>=DEBUG"})
config = env.get_env_config()
status = env.status()
print(
    json.dumps(
        {
            "redirect": redirect,
            "limited_status_model": limited_status["model"]["name"],
            "limited_machines": sorted(limited_status["machines"]),
            "limited_agent_version": limited_config["config"]["agent-version"]["value"],
            "added_machine": added["machine"],
            "add_machines_sends": sent.count("AddMachines"),
            "logging_config": config["config"]["logging-config"]["value"],
            "machines": sorted(status["machines"]),
        }
    )
)
