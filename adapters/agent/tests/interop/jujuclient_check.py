"""python-jujuclient 0.54.0 against lockstep, unchanged.

Asks RedirectInfo (which must say "not redirected"), logs in, reads status while the agent
is limited, then asks for the model config, which lockstep refuses with `upgrade in
progress` until the agent is Ready: jujuclient retries it about once a second until it
succeeds. Prints one JSON line with what it saw.
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
status = env.status()

sent = []
original = env._send_request


def counting(op):
    sent.append(op.get("request"))
    return original(op)


env._send_request = counting
config = env.get_env_config()
print(
    json.dumps(
        {
            "redirect": redirect,
            "status_model": status["model"]["name"],
            "model_get_sends": sent.count("ModelGet"),
            "agent_version": config["config"]["agent-version"]["value"],
        }
    )
)
