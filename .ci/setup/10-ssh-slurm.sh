#!/usr/bin/env bash
# OpenSSH, Slurm and munge for the SSH and Slurm launcher tests (tests/test_cluster_ssh.py,
# tests/test_cluster_slurm.py) and the several-machines tests (tests/test_multihost.py). The
# tests start their own private sshd, munged, slurmctld and slurmd; the system's services are
# not wanted, so none is started by the install (policy-rc.d answers "not now" while it runs).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
packages=(openssh-server openssh-client slurm-wlm munge)
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
    trap 'rm -f "$policy"' EXIT
fi
apt_install "${packages[@]}"
for tool in sshd slurmctld slurmd munged; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || { echo "$tool missing after the install"; exit 1; }
done
echo "OpenSSH, Slurm and munge ready (own policy-rc.d: $own_policy)"
