#!/usr/bin/env bash
# Makes the container images a real node of the test bed runs, without a registry: OCI
# image archives built from what is on this machine, named as upstream names them, for
# `ctr -n k8s.io images import`. Prints the directory that holds them.
#
#   registry.k8s.io/pause:<tag>                  Kubernetes's pause.c (from the module
#                                                k8s/go.mod pins), linked statically
#   registry.k8s.io/e2e-test-images/agnhost:<v>  the agnhost binary k8s/build.sh built, on
#                                                a minimal Debian 12 (debootstrap) with the
#                                                tools the e2e suites run in it
#
# The tags are those of the e2e framework's image manifest for this Kubernetes version
# (test/utils/image/manifest.go; `e2e.test --list-images` prints the same). The
# archives live beside the binaries (k8s/build.sh's cache directory, keyed by version);
# one already made is not made again, and an interrupted run leaves no half archive.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/build.sh" agnhost)
out=$bin/../images
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

modcache=$(cd "$here" && GOTOOLCHAIN=local go env GOMODCACHE)
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2 } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$here/go.mod" | head -n 1)
source_dir=$modcache/k8s.io/kubernetes@$version
# The tag the e2e framework gives an image: `configs[Pause] = Config{…, "pause", "3.10.2"}`.
manifest=$source_dir/test/utils/image/manifest.go
tag_of() { # the image's key in the manifest
    sed -n "s/^\tconfigs\[$1\] = Config{[^,]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$manifest"
}

# Moves the file $2 into the OCI layout $1 as a blob; prints `<digest hex> <size>`.
blob() {
    local digest size
    digest=$(sha256sum "$2" | cut -d' ' -f1)
    size=$(stat -c %s "$2")
    mv "$2" "$1/blobs/sha256/$digest"
    echo "$digest $size"
}

# An OCI archive of one layer made from the directory $1, named $2, with $3 in its
# config (its Entrypoint and Cmd, as JSON members), written to $4.
oci_archive() {
    local rootfs=$1 name=$2 run=$3 archive=$4 work layer layer_size config config_size
    local manifest manifest_size
    work=$(mktemp -d "$out/.work.XXXXXX")
    mkdir -p "$work/blobs/sha256"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
    read -r layer layer_size < <(blob "$work" "$work/layer.tar")
    printf '{"architecture":"amd64","os":"linux","config":{%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$run" "$layer" >"$work/config.json"
    read -r config config_size < <(blob "$work" "$work/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
    read -r manifest manifest_size < <(blob "$work" "$work/manifest.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$manifest_size" "$name" "${name##*:}" >"$work/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -cf "$archive.partial" oci-layout index.json blobs
    mv "$archive.partial" "$archive"
    rm -rf "$work"
}

pause_tag=$(tag_of Pause)
agnhost_tag=$(tag_of Agnhost)
[[ -n $pause_tag && -n $agnhost_tag ]] || { echo "images.sh: no tags in $manifest" >&2; exit 1; }
if [[ ! -s $out/pause.tar ]]; then
    rootfs=$(mktemp -d "$out/.rootfs.XXXXXX")
    gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag-nodus" \
        -o "$rootfs/pause" "$source_dir/build/pause/linux/pause.c"
    strip "$rootfs/pause"
    oci_archive "$rootfs" "registry.k8s.io/pause:$pause_tag" '"Entrypoint":["/pause"]' "$out/pause.tar"
    rm -rf "$rootfs"
fi

if [[ ! -s $out/agnhost.tar ]]; then
    # The tools the e2e suites run inside agnhost pods (curl, nc, dig, ip, ping): the
    # upstream image is Alpine with these; here, a minimal Debian made by debootstrap.
    command -v debootstrap >/dev/null || { echo "images.sh: debootstrap is not installed" >&2; exit 1; }
    rootfs=$(mktemp -d "$out/.rootfs.XXXXXX")
    if ! debootstrap --variant=minbase \
        --include=curl,netcat-openbsd,bind9-dnsutils,iproute2,iputils-ping,ca-certificates \
        bookworm "$rootfs" http://deb.debian.org/debian >"$out/.debootstrap.log" 2>&1; then
        tail -n 20 "$out/.debootstrap.log" >&2
        exit 1
    fi
    rm -rf "$rootfs"/usr/share/{doc,man,info,locale} "$rootfs"/var/cache/apt/* \
        "$rootfs"/var/lib/apt/lists/*
    cp "$bin/agnhost" "$rootfs/agnhost"
    ln -s agnhost "$rootfs/agnhost-2"
    oci_archive "$rootfs" "registry.k8s.io/e2e-test-images/agnhost:$agnhost_tag" \
        '"Entrypoint":["/agnhost"],"Cmd":["pause"]' "$out/agnhost.tar"
    rm -rf "$rootfs"
fi
echo "$(cd "$out" && pwd)"
