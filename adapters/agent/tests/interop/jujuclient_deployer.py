"""python-jujuclient 0.54.0 as the seed's deployer used it, unchanged, on one connection.

RedirectInfo, login, status, then a deployment: three applications (`<p>-web`,
`<p>-db`, `<p>-lb`, store charm URLs, which lockstep records as given), two more units of
`<p>-web`, two relations, and status again. jujuclient resends a call refused
`upgrade in progress` about once a second (`BaseRPC._rpc_retry_if_upgrading`) on the
same connection, which it never reopens: any other error, or a closed connection, raises.
Sends are counted by request by wrapping the connection's `_send_request`. Prints one
JSON line.

Arguments: the API port, a file holding the controller's CA, the model's uuid, the admin
password. $LOCKSTEP_DEPLOYER_PREFIX is `<p>`, the applications' prefix.
"""
import json
import os
import sys

from jujuclient.juju2.environment import Environment

port, ca_path, uuid, password = sys.argv[1:5]
prefix = os.environ["LOCKSTEP_DEPLOYER_PREFIX"]
env = Environment(
    "wss://127.0.0.1:%s/model/%s/api" % (port, uuid), ca_cert=ca_path, env_uuid=uuid
)
connection = env.conn
sent = []
original = env._send_request


def counting(op):
    sent.append(op.get("request"))
    return original(op)


env._send_request = counting

redirect = env.redirect_info()
env.login(password, user="user-admin")
first_status = env.status()
web, db, lb = prefix + "-web", prefix + "-db", prefix + "-lb"
env.deploy(web, "cs:jammy/wordpress", num_units=1)
env.deploy(db, "cs:jammy/postgresql", num_units=1)
env.deploy(lb, "cs:jammy/haproxy", num_units=1)
added_units = env.add_units(web, 2)["units"]
relations = [
    env.add_relation(web + ":db", db + ":db")["endpoints"],
    env.add_relation(lb + ":reverseproxy", web + ":website")["endpoints"],
]
status = env.status()
mine = sorted(name for name in status["applications"] if name.startswith(prefix + "-"))
print(
    json.dumps(
        {
            "redirect": redirect,
            "first_status_model": first_status["model"]["name"],
            "added_units": added_units,
            "relations": [sorted(endpoints) for endpoints in relations],
            "applications": mine,
            "units": {
                name: sorted(status["applications"][name]["units"] or {}) for name in mine
            },
            "same_connection": env.conn is connection,
            "sends": {request: sent.count(request) for request in sorted(set(sent))},
        }
    )
)
