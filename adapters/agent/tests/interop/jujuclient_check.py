"""python-jujuclient 0.54.0 against lockstep, unchanged.

Asks RedirectInfo (which must say "not redirected"), logs in, reads status and the model
config while the agent is limited (reads are served in every phase), then sets a model
config key, which lockstep refuses with `upgrade in progress` until the agent is Ready:
jujuclient retries it about once a second until it succeeds. Prints one JSON line with what
it saw.
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
limited_config = env.get_env_config()

sent = []
original = env._send_request


def counting(op):
    sent.append(op.get("request"))
    return original(op)


env._send_request = counting
env.set_env_config({"logging-config": "<root>=DEBUG"})
env._send_request = original
config = env.get_env_config()
print(
    json.dumps(
        {
            "redirect": redirect,
            "status_model": status["model"]["name"],
            "limited_agent_version": limited_config["config"]["agent-version"]["value"],
            "model_set_sends": sent.count("ModelSet"),
            "agent_version": config["config"]["agent-version"]["value"],
            "logging_config": config["config"]["logging-config"]["value"],
        }
    )
)
