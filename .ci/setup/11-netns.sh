#!/usr/bin/env bash
# What tests/test_multihost.py needs to make two "hosts" of network namespaces on this machine:
# iproute2 (ip netns, veth, tc), util-linux (nsenter, unshare) and OpenSSH (an sshd per host;
# 10-ssh-slurm.sh installs it too, without starting the system's service). Needs root; then
# checks that a namespace can be made here (some containers forbid it: the tests then skip).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
policy=/usr/sbin/policy-rc.d
if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
fi
apt_install iproute2 util-linux openssh-server openssh-client
probe=pdlmh-ci-probe
ip netns add "$probe"
ip netns delete "$probe"
echo "network namespaces can be made here"
