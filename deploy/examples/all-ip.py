#!/usr/bin/env python3
"""all-ip: a backend that subscribes to the running nodus agent.

For every Service labelled service.kubernetes.io/service-proxy-name=all-ip, everything
sent to its IPv4 external IPs is DNATed to one of its ready endpoints on this node,
whatever the port and protocol, in an nftables table of its own (`ip nodus-all-ip`).
nodus's own proxy leaves such services alone; its view still carries them.

It reads the agent's subscription socket (docs/backends.md has the format): a snapshot,
then the changes of every batch. After each `Synced` line it replaces its table in one
`nft -f` transaction. When the agent restarts it reconnects and resumes where it was.

Usage: all-ip.py SOCKET   (/var/lib/nodus/view-$NODE_NAME.sock by default). Needs root
and nft. Removes its table when it stops (SIGINT or SIGTERM).
"""
import json
import signal
import socket
import subprocess
import sys
import time

TABLE = "nodus-all-ip"
OWNER = "all-ip"


def dnat_map(services, node):
    """External IP -> local endpoint, for the services handed to this backend."""
    dnat = {}
    for svc in services.values():
        spec = svc.get("spec") or {}
        if spec.get("serviceProxyName") != OWNER:
            continue
        local = sorted(
            e["ip"]
            for e in svc.get("endpoints", [])
            if e.get("ready") and e.get("nodeName") == node and ":" not in e["ip"]
        )
        for ip in spec.get("externalIPs", []):
            if local and ":" not in ip:
                dnat[ip] = local[0]
    return dnat


def program(dnat):
    """Replaces the table in one transaction (an empty map leaves no rule)."""
    elements = ", ".join(f"{ip} : {endpoint}" for ip, endpoint in sorted(dnat.items()))
    rules = [f"table ip {TABLE} {{}}", f"delete table ip {TABLE}"]
    if dnat:
        rules += [
            f"table ip {TABLE} {{",
            f"  map external {{ type ipv4_addr : ipv4_addr; elements = {{ {elements} }} }}",
            # Before nodus's own nat chains (dstnat, -100), which skip these services anyway.
            "  chain prerouting { type nat hook prerouting priority -110; "
            "dnat to ip daddr map @external; }",
            "  chain output { type nat hook output priority -110; "
            "dnat to ip daddr map @external; }",
            "}",
        ]
    subprocess.run(["nft", "-f", "-"], input="\n".join(rules) + "\n", text=True, check=True)


def follow(path):
    """Follows the agent at `path` forever; returns only on a signal."""
    services, node, since, programmed = {}, "", None, None
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(path)
                hello = {"since": since} if since else {}
                conn.sendall((json.dumps(hello) + "\n").encode())
                for raw in conn.makefile("rb"):
                    line = json.loads(raw)
                    kind = line["kind"]
                    if kind == "Snapshot":
                        services, node = {}, line["node"]
                        since = {"epoch": line["epoch"], "seq": line["seq"]}
                    elif kind == "Service":
                        key = (line["namespace"], line["name"])
                        if line["object"] is None:
                            services.pop(key, None)
                        else:
                            services[key] = line["object"]
                    elif kind == "Synced":
                        since["seq"] = line["seq"]
                        dnat = dnat_map(services, node)
                        if dnat != programmed:
                            program(dnat)
                            programmed = dnat
                            print(f"all-ip: batch {line['seq']}: {dnat}", flush=True)
                    elif kind == "Error":
                        print(f"all-ip: the agent says: {line['reason']}", file=sys.stderr)
        except (OSError, ValueError, KeyError, subprocess.CalledProcessError) as error:
            print(f"all-ip: {error}; reconnecting", file=sys.stderr)
        time.sleep(1)


def stop(*_):
    program({})
    sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    follow(sys.argv[1])
