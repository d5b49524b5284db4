#!/usr/bin/env bash
# Writes an OCI image archive of one layer, for `ctr images import`, without a registry or
# an image builder: the layer is the directory ROOTFS, and the archive holds one image for
# each NAME RUN pair, RUN being the Entrypoint and Cmd as JSON members of the image's
# config (`"Entrypoint":["/pause"]`). The images share the layer, so containerd stores it
# once. The same directory always makes the same archive (sorted, owned by root, mtime 0);
# an interrupted run leaves no half archive.
#
#   k8s/oci-archive.sh ROOTFS ARCHIVE NAME RUN [NAME RUN]...
set -euo pipefail
rootfs=${1:?"usage: k8s/oci-archive.sh ROOTFS ARCHIVE NAME RUN [NAME RUN]..."}
archive=${2:?"usage: k8s/oci-archive.sh ROOTFS ARCHIVE NAME RUN [NAME RUN]..."}
shift 2
(($# > 0 && $# % 2 == 0)) || { echo "k8s/oci-archive.sh: give each image's NAME and RUN" >&2; exit 2; }

work=$(mktemp -d "$archive.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blobs/sha256"

# Moves the file $1 into the layout as a blob; prints `<digest hex> <size>`.
blob() {
    local digest size
    digest=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$work/blobs/sha256/$digest"
    echo "$digest $size"
}

tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
read -r layer layer_size < <(blob "$work/layer.tar")
manifests=""
while (($# > 0)); do
    name=$1 run=$2
    shift 2
    printf '{"architecture":"amd64","os":"linux","config":{%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$run" "$layer" >"$work/config.json"
    read -r config config_size < <(blob "$work/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
    read -r manifest manifest_size < <(blob "$work/manifest.json")
    manifests+=${manifests:+,}$(printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
        "$manifest" "$manifest_size" "$name" "${name##*:}")
done
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "$manifests" >"$work/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" \
    -cf "$archive.partial" oci-layout index.json blobs
mv "$archive.partial" "$archive"
