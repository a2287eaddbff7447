"""python-jujuclient 0.54.0, unchanged, waiting for a controller that is upgrading.

Used by `benches/jujuclient.rs`. Imports first and prints `waiting` (so that the
interpreter's start is over before the controller starts), then waits for the controller's
`controller.yaml` and runs what a jujuclient user runs: connect, log in, set a model config
key, `ModelConfig.ModelSet` (`set_env_config`): a write, answered `upgrade in progress`
until Ready (reads are served in every phase). jujuclient itself resends a call answered
`upgrade in progress` once a second (`BaseRPC._rpc_retry_if_upgrading`). jujuclient does
not reconnect a closed connection (the controller closes every connection when it
re-executes into its new binary), so this loop connects and logs in again after 10 ms when
a connection fails or closes: the only waiting not jujuclient's own.

Prints one JSON line: the wall-clock time (seconds since the Unix epoch) of the first
`ModelSet` sent and of its first successful answer, the `ModelSet`s sent, the connections
made, and the errors that ended a connection.
"""
import json
import os
import sys
import tempfile
import time

import yaml
from jujuclient.juju2.environment import Environment

controller_yaml, deadline_seconds = sys.argv[1], float(sys.argv[2])
deadline = time.time() + deadline_seconds
print("waiting", flush=True)

while not os.path.exists(controller_yaml):
    if time.time() > deadline:
        sys.exit("no %s within %ss" % (controller_yaml, deadline_seconds))
    time.sleep(0.001)
with open(controller_yaml) as file:
    controller = yaml.safe_load(file)
ca = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)
ca.write(controller["ca-cert"])
ca.close()
uuid = controller["model-uuid"]
url = "wss://%s/model/%s/api" % (controller["api-endpoints"][0], uuid)

sends = []
connections = 0
errors = []
success = None
while success is None:
    if time.time() > deadline:
        sys.exit("no successful call within %ss: %s" % (deadline_seconds, errors))
    try:
        env = Environment(url, ca_cert=ca.name, env_uuid=uuid)
        connections += 1
        env.login(controller["password"], user="user-" + controller["user"])
        original = env._send_request

        def counting(op, original=original):
            if op.get("request") == "ModelSet":
                sends.append(time.time())
            return original(op)

        env._send_request = counting
        env.set_env_config({"logging-config": "<root>=INFO"})
        success = time.time()
    except Exception as error:  # refused before the controller listens, or closed by it
        errors.append(type(error).__name__)
        time.sleep(0.01)
os.unlink(ca.name)
print(
    json.dumps(
        {
            "first_sent_unix": sends[0] if sends else None,
            "success_unix": success,
            "model_set_sends": len(sends),
            "connections": connections,
            "errors": errors,
        }
    )
)
