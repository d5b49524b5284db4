#!/bin/sh
# A backend for `nodus run --on-change`: for every service handed to it with the label
# service.kubernetes.io/service-proxy-name=example-backend, keep a file with one line per
# service port and endpoint that nodus chose for cluster traffic from this node (after
# topology hints and the terminating fallback): "port endpoint-ip endpoint-port". Remove
# it when the service goes or changes hands. nodus's own proxy skips such services but
# still resolves them. stdin: JSON lines, as `nodus view --watch` prints them.
set -eu
dir=${BACKEND_DIR:-/run/example-backend}
mkdir -p "$dir"
jq -c 'select(.kind == "Service")' | while read -r line; do
    file="$dir/$(printf '%s' "$line" | jq -r '"\(.namespace)_\(.name)"')"
    owner=$(printf '%s' "$line" | jq -r '.object.spec.serviceProxyName // empty')
    if [ "$owner" = example-backend ]; then
        printf '%s' "$line" |
            jq -r '.object.ports[] | .port as $p | .families[].cluster[] | "\($p) \(.ip) \(.port)"' |
            sort >"$file.new"
        mv "$file.new" "$file"
    else
        rm -f "$file"
    fi
done
